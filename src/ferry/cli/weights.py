"""``ferry export-weights``: a tracked model's ``state_dict`` out of a checkpoint, for
deployment (``ferry.ops.weights``; from Python: ``ferry.state_dict``)."""

from __future__ import annotations

import click

from ferry.cli.output import emit_json, human_bytes, json_option
from ferry.cli.places import URL, check_output
from ferry.ops import weights


@click.command(
    "export-weights",
    epilog="""\b
Exit status:
  0  written
  2  bad input: no such model (the message lists the checkpoint's), several models and
     no --model, a sharded model, safetensors not installed, OUT in a folder that
     does not exist or cannot be written
  4  no committed checkpoint at CHECKPOINT
  5  the checkpoint is damaged (its checksums do not match)

\b
Examples:
  ferry export-weights ferry-checkpoints/train-1a2b3c4d model.safetensors
  ferry export-weights ckpts/step-000000001200 model.pt --model model:GPT:0""",
)
@click.argument("checkpoint", type=URL)
@click.argument("out", type=click.Path(dir_okay=False, writable=True))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(weights.FORMATS),
    help="safetensors, or pt (a torch file for torch.load(weights_only=True)).  "
    "[default: pt for OUT ending in .pt, .pth or .bin, else safetensors]",
)
@click.option(
    "--model",
    metavar="NAME",
    help="The tracked model, by the name `ferry inspect` shows.  [default: the only model]",
)
@json_option
def export_weights_cmd(checkpoint: str, out: str, fmt: str | None, model: str | None, as_json: bool) -> None:
    """Write a tracked model's state_dict from CHECKPOINT to OUT, as safetensors or a torch file.

    CHECKPOINT is a checkpoint, or a checkpoint root (its newest good checkpoint). The
    tensors are written bitwise as saved, with their dtypes, on the CPU; tensors that
    shared memory (tied weights) are written each on its own. The safetensors format needs
    the safetensors package: pip install 'gpuferry[safetensors]'.
    """
    check_output(out, "the weights' file", "give OUT a file in a folder you can write")
    done = weights.export(checkpoint, out, fmt=weights.format_for(out, fmt), model=model)
    if as_json:
        emit_json(done.__dict__)
        return
    click.echo(
        f"{done.model} of {done.source} (step {done.step}): {done.tensors} tensors, "
        f"{human_bytes(done.bytes)}, written to {done.out} ({done.format})"
    )


COMMANDS = [export_weights_cmd]
