"""The ``ferry`` command line: one module per command group, registered here."""

from __future__ import annotations

import logging
import sys

import click

from ferry._version import __version__
from ferry.errors import FerryError


class FerryGroup(click.Group):
    """Turns ferry's errors into a one-line message and their documented exit code."""

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
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(message)s", stream=sys.stderr)  # fmt: skip


def _register() -> None:
    from ferry.cli import inspect, process

    for module in (inspect, process):
        for command in module.COMMANDS:
            main.add_command(command)


_register()
