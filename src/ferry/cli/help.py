"""``ferry help [TOPIC]``: the documentation, as installed. The pages of ``docs/`` ship in
the package (``ferry/docs``, package data), so that what ``--help`` and the error messages
point at (``ferry help cli``) is there wherever ferry is installed, without a checkout."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

import click

DOCS = Path(__file__).resolve().parent.parent / "docs"
"""``ferry/docs``: in a checkout, a link to the repository's ``docs/``; in a wheel, its copy."""


def pages() -> dict[str, Path]:
    """Topic -> its page: every ``*.md`` under ``ferry/docs``, by name without ``.md``."""
    if not DOCS.is_dir():
        return {}
    return {p.stem: p for p in sorted(DOCS.glob("*.md"))}


def title(page: Path) -> str:
    """A page's first heading, without its ``#``."""
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return ""


@click.command("help")
@click.argument("topic", required=False)
@click.pass_context
def help_cmd(ctx: click.Context, topic: str | None) -> None:
    """Read a page of ferry's documentation (ferry help lists them), or a command's help.

    TOPIC is a page (cli, jobs, api, zero-code, ...) or a command (`ferry help run` is
    `ferry run --help`). A page is Markdown, shown through $PAGER on a terminal.
    """
    found = pages()
    if topic is None:
        width = max((len(name) for name in found), default=0)
        click.echo("ferry help TOPIC shows a page; the pages:")
        for name, page in found.items():
            click.echo(f"  {name.ljust(width)}  {title(page)}")
        click.echo("and every command: ferry help COMMAND (ferry --help lists them)")
        return
    name = topic.removesuffix(".md")
    if name in found:
        text = found[name].read_text(encoding="utf-8")
        if sys.stdout.isatty():
            click.echo_via_pager(text)
        else:
            click.echo(text, nl=False)
        return
    parent = ctx.parent
    group = parent.command if parent is not None else None
    command = group.get_command(ctx, name) if isinstance(group, click.Group) else None
    if command is not None and parent is not None:
        with click.Context(command, info_name=name, parent=parent) as sub:
            click.echo(command.get_help(sub))
        return
    close = difflib.get_close_matches(name, list(found), n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise click.BadParameter(
        f"no page or command {topic!r}.{hint} The pages: {', '.join(found)} (`ferry help` lists them)",
        ctx,
        param_hint="'TOPIC'",
    )


COMMANDS = [help_cmd]
