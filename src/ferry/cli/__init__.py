"""The ``ferry`` command line: one module per command group, registered here."""

from __future__ import annotations

import importlib
import logging
import sys

import click

from ferry._version import __version__
from ferry.errors import FerryError

COMMANDS: dict[str, str] = {
    "run": "run",
    "inspect": "inspect",
    "verify": "inspect",
    "suspend": "process",
    "wake": "process",
    "process-state": "process",
    "dump": "process",
    "restore": "process",
    "list": "jobs",
    "status": "jobs",
    "checkpoint": "jobs",
    "migrate": "migrate",
    "export": "migrate",
    "resume": "migrate",
    "report": "report",
    "chaos": "chaos",
}
"""Command name -> the module of ferry.cli that defines it (in its COMMANDS list). Modules
are imported only when one of their commands is used, so `ferry run` does not import torch."""


class FerryGroup(click.Group):
    """Loads commands on demand; turns ferry's errors into a one-line message and their
    documented exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = COMMANDS.get(cmd_name)
        if module_name is None:
            return None
        module = importlib.import_module(f"ferry.cli.{module_name}")
        return next((c for c in module.COMMANDS if c.name == cmd_name), None)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except FerryError as exc:
            click.echo(f"ferry: error: {exc}", err=True)
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
