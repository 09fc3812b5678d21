"""The ``ferry`` command line: one module per command group, registered here."""

from __future__ import annotations

import difflib
import importlib
import json
import logging
import sys
from collections.abc import Sequence

import click
from click.shell_completion import CompletionItem

from ferry._version import __version__
from ferry.errors import FerryError

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "Run COMMAND as a preemptible job: ferry run [OPTIONS] -- COMMAND [ARGS]..."),
    "inspect": ("inspect", "Show a checkpoint's step, time, size and tensors (URL: a checkpoint or a root)."),
    "verify": ("inspect", "Check a checkpoint's manifest and checksums; exits non-zero if it is damaged."),
    "suspend": (
        "process",
        "Freeze PID's CUDA state and release its GPU memory (lock, then checkpoint to host memory).",
    ),
    "wake": ("process", "Bring PID's GPU memory back (onto other GPUs with --map) and let it continue."),
    "process-state": (
        "process",
        "Show PID's CUDA checkpoint state, the GPUs it holds, and ferry's record of its suspend.",
    ),
    "dump": (
        "process",
        "Dump PID's whole process tree to DIRECTORY with CRIU (GPU state through its CUDA plugin).",
    ),
    "restore": (
        "process",
        "Restore a process tree that `ferry dump` wrote to DIRECTORY (under its old PID).",
    ),
    "list": (
        "jobs",
        "Ferry jobs, and the GPU processes NVML sees (marking which are ferry jobs). Also: ls, ps.",
    ),
    "status": ("jobs", "One job in detail: state, step, devices, checkpoint history with save times."),
    "checkpoint": ("jobs", "Ask JOB (an id or a PID) for a checkpoint at its next safe point."),
    "stop": ("jobs", "Checkpoint JOB and stop it, once committed (checkpoint --stop --wait)."),
    "prune": (
        "prune",
        "Delete the directories of jobs that ended longer ago than --older-than (never a live one).",
    ),
    "migrate": (
        "migrate",
        "Move JOB to other GPUs of this machine: checkpoint, hand over, resume on DEVICES.",
    ),
    "export": (
        "migrate",
        "Checkpoint and stop JOB, leaving a bundle at DEST_URL that `ferry resume` starts again.",
    ),
    "resume": (
        "migrate",
        "Start a job from a bundle (ferry export) or a checkpoint URL: ferry resume SOURCE [-- COMMAND].",
    ),
    "report": (
        "report",
        "Draw JOB's training steps over wall time, checkpoints, interruptions and migrations.",
    ),
    "chaos": ("chaos", "Run COMMAND plainly, then under `ferry run` with seeded faults, and compare."),
}
"""Command name -> (the module of ferry.cli that defines it, in its COMMANDS list; the first
paragraph of its help). Modules are imported only when one of their commands runs, so
`ferry --help`, completion and `ferry run` do not import torch; a unit test keeps the help
texts equal to the commands' own."""


ALIASES = {"ls": "list", "ps": "list"}
"""The verbs users type for a command, from other tools; not listed in the help."""


def wants_json(args: Sequence[str]) -> bool:
    """``--json`` among a command's own arguments (not after ``--``: those are COMMAND's)."""
    for arg in args:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def _short_help(name: str, limit: int = 45) -> str:
    """A command's one-line help, shortened as click shortens the command's own."""
    return click.Command(name, help=COMMANDS[name][1]).get_short_help_str(limit)


class FerryGroup(click.Group):
    """Loads commands on demand; turns ferry's errors into a one-line message and their
    documented exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd_name = ALIASES.get(cmd_name, cmd_name)
        if cmd_name not in COMMANDS:
            return None
        module = importlib.import_module(f"ferry.cli.{COMMANDS[cmd_name][0]}")
        return next((c for c in module.COMMANDS if c.name == cmd_name), None)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``ferry --help``, from the table: no command module imported."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [(name, _short_help(name, limit)) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """Command names for shell completion, from the table; options as click gives them."""
        if incomplete.startswith("-"):
            return super().shell_complete(ctx, incomplete)
        return [
            CompletionItem(name, help=_short_help(name))
            for name in self.list_commands(ctx)
            if name.startswith(incomplete)
        ]

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """A mistyped command gets the closest names ("did you mean")."""
        name = args[0] if args else ""
        if (
            args
            and not ctx.resilient_parsing
            and not name.startswith("-")
            and self.get_command(ctx, name) is None
        ):
            close = difflib.get_close_matches(name, [*COMMANDS, *ALIASES], n=3, cutoff=0.6)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            ctx.fail(f"No such command {name!r}.{hint} (ferry --help lists them)")
        return super().resolve_command(ctx, args)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["ferry.json"] = wants_json(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> object:
        as_json = bool(ctx.meta.get("ferry.json"))
        try:
            return super().invoke(ctx)
        except FerryError as exc:
            if as_json:
                click.echo(json.dumps({"error": str(exc), "exit": exc.exit_code}))
            else:
                click.echo(f"ferry: error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except click.ClickException as exc:  # a usage error of the command: its exit status, as JSON
            if not as_json:
                raise
            click.echo(json.dumps({"error": exc.format_message(), "exit": exc.exit_code}))
            ctx.exit(exc.exit_code)


@click.group(cls=FerryGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ferry")
@click.option("-v", "--verbose", is_flag=True, help="Log debug details to stderr.")
def main(verbose: bool) -> None:
    """Make PyTorch training jobs preemptible and movable.

    Checkpoint a job on demand or on a scheduler's signal, stop it, move it to another
    GPU, node or cluster, and resume it exactly where it left off.
    """
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(message)s", stream=sys.stderr
    )
