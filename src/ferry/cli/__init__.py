"""The ``ferry`` command line: one module per command group, registered here."""

from __future__ import annotations

import difflib
import importlib
import json
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import click
from click.shell_completion import CompletionItem

from ferry._version import __version__
from ferry.errors import FerryError


class Entry(NamedTuple):
    module: str
    """The module of ferry.cli that defines the command, in its COMMANDS list."""
    group: str
    """The heading it is listed under in ``ferry --help`` (one of GROUPS)."""
    help: str
    """The first paragraph of its help: its one-line summary."""


GROUPS = {
    "jobs": "Jobs (started with ferry run; JOB is a job id or a PID)",
    "checkpoints": "Checkpoints (URL: a checkpoint, or a root of them)",
    "process": "Process-level (CUDA driver and CRIU; the script does not cooperate)",
    "tools": "Tools",
}
"""The headings of ``ferry --help``, in order."""

COMMANDS: dict[str, Entry] = {
    "run": Entry("run", "jobs", "Run COMMAND as a preemptible job: ferry run [OPTIONS] -- COMMAND [ARGS]..."),
    "list": Entry(
        "jobs",
        "jobs",
        "Ferry jobs, and the GPU processes NVML sees (marking which are ferry jobs). Also: ls, ps.",
    ),
    "status": Entry(
        "jobs", "jobs", "One job in detail: state, step, devices, checkpoint history with save times."
    ),
    "checkpoint": Entry("jobs", "jobs", "Ask JOB (an id or a PID) for a checkpoint at its next safe point."),
    "stop": Entry("jobs", "jobs", "Checkpoint JOB and stop it, once committed (checkpoint --stop --wait)."),
    "migrate": Entry(
        "migrate", "jobs", "Move JOB to other GPUs of this machine: checkpoint, hand over, resume on DEVICES."
    ),
    "export": Entry(
        "migrate",
        "jobs",
        "Checkpoint and stop JOB, leaving a bundle at DEST_URL that `ferry resume` starts again.",
    ),
    "resume": Entry(
        "migrate",
        "jobs",
        "Start a job from a bundle (ferry export) or a checkpoint URL: ferry resume SOURCE [-- COMMAND].",
    ),
    "report": Entry(
        "report",
        "jobs",
        "Draw JOB's life across its runs: steps over time, checkpoints, stops, resumes, failures, moves.",
    ),
    "prune": Entry(
        "prune",
        "jobs",
        "Delete the directories of jobs that ended longer ago than --older-than (never a live one).",
    ),
    "inspect": Entry(
        "inspect", "checkpoints", "Show a checkpoint's step, time, size, tracked objects and tensors."
    ),
    "verify": Entry(
        "inspect",
        "checkpoints",
        "Check a checkpoint's manifest and checksums; exits non-zero if it is damaged.",
    ),
    "export-weights": Entry(
        "weights",
        "checkpoints",
        "Write a tracked model's state_dict from CHECKPOINT to OUT, as safetensors or a torch file.",
    ),
    "process": Entry(
        "process",
        "process",
        "Act on a process by its PID (no ferry job needed): suspend, wake, state (CUDA driver); "
        "dump, restore (CRIU).",
    ),
    "chaos": Entry(
        "chaos", "tools", "Run COMMAND plainly, then under `ferry run` with seeded faults, and compare."
    ),
    "help": Entry(
        "help", "tools", "Read a page of ferry's documentation (ferry help lists them), or a command's help."
    ),
}
"""Command name -> its entry, in the order ``ferry --help`` lists them within their group.
Modules are imported only when one of their commands runs, so `ferry --help`, completion
and `ferry run` do not import torch; a unit test keeps the help texts equal to the
commands' own."""


ALIASES = {"ls": "list", "ps": "list"}
"""The verbs users type for a command, from other tools; not listed in the help."""

RENAMED = {
    "suspend": "process suspend",
    "wake": "process wake",
    "process-state": "process state",
    "dump": "process dump",
    "restore": "process restore",
}
"""Old name -> the command's name now. The process-level verbs went under ``ferry process``
(``ferry restore`` read as the opposite of ``ferry.restore()``); their old names work on for
one release, hidden, each with a note on stderr (``Renamed``)."""


def wants_json(args: Sequence[str]) -> bool:
    """``--json`` among a command's own arguments (not after ``--``: those are COMMAND's)."""
    for arg in args:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def suggest_command(
    ctx: click.Context,
    args: Sequence[str],
    lookup: Callable[[click.Context, str], click.Command | None],
    names: Mapping[str, str],
    listed_by: str,
) -> None:
    """Fail with the closest names ("did you mean") when ``args`` start with no command's name.

    ``names`` maps what may be typed to what to suggest (an old name to the new form).
    """
    name = args[0] if args else ""
    if not args or ctx.resilient_parsing or name.startswith("-") or lookup(ctx, name) is not None:
        return
    close = dict.fromkeys(names[c] for c in difflib.get_close_matches(name, list(names), n=3, cutoff=0.6))
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    ctx.fail(f"No such command {name!r}.{hint} ({listed_by} lists them)")


class Renamed(click.Command):
    """A command's old name, kept for one release: hidden from the help and completion, it runs
    the command unchanged after a one-line note on stderr that names the new form (stdout is
    the command's own, for the scripts that read it)."""

    def __init__(self, old: str, new: str, command: click.Command) -> None:
        super().__init__(
            old,
            context_settings=command.context_settings,
            callback=command.callback,
            params=command.params,
            help=command.help,
            epilog=f"Now `ferry {new}`: the name `ferry {old}` goes in the next release.",
            short_help=command.short_help,
            hidden=True,
        )
        self.new = new

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:
            click.echo(
                f"ferry: note: `ferry {self.name}` is now `ferry {self.new}` (the old name goes in the "
                "next release)",
                err=True,
            )
        return super().parse_args(ctx, args)


def _short_help(name: str, limit: int = 45) -> str:
    """A command's one-line help, shortened as click shortens the command's own."""
    return click.Command(name, help=COMMANDS[name].help).get_short_help_str(limit)


class FerryGroup(click.Group):
    """Loads commands on demand; turns ferry's errors into a one-line message and their
    documented exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in RENAMED:
            group_name, sub_name = RENAMED[cmd_name].split()
            group = self.get_command(ctx, group_name)
            command = group.get_command(ctx, sub_name) if isinstance(group, click.Group) else None
            return None if command is None else Renamed(cmd_name, RENAMED[cmd_name], command)
        cmd_name = ALIASES.get(cmd_name, cmd_name)
        if cmd_name not in COMMANDS:
            return None
        module = importlib.import_module(f"ferry.cli.{COMMANDS[cmd_name].module}")
        return next((c for c in module.COMMANDS if c.name == cmd_name), None)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``ferry --help``, by group, each with its whole summary,
        from the table: no command module imported."""
        width = max(len(name) for name in COMMANDS)  # one column for every group
        for group, heading in GROUPS.items():
            rows = [(name.ljust(width), e.help) for name, e in COMMANDS.items() if e.group == group]
            with formatter.section(heading):
                formatter.write_dl(rows, col_max=width)

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
        """A mistyped command gets the closest names ("did you mean"), an old name its new form."""
        names = {**{c: c for c in [*COMMANDS, *ALIASES]}, **RENAMED}
        suggest_command(ctx, args, self.get_command, names, "ferry --help")
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


@click.group(
    cls=FerryGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120}
)
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
