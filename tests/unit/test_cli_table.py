"""`ferry --help` and completion come from ferry.cli.COMMANDS, not from the command modules
(which import torch): the table must say what the commands themselves say."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from ferry.cli import COMMANDS, GROUPS, _short_help, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_table_holds_each_commands_own_help(name: str) -> None:
    command = main.get_command(click.Context(main), name)
    assert command is not None, f"ferry.cli.{COMMANDS[name].module} defines no command {name!r}"
    first = inspect.cleandoc(command.help or "").split("\n\n")[0].replace("\n", " ")
    assert COMMANDS[name].help == first
    for limit in (30, 45, 80):
        assert _short_help(name, limit) == command.get_short_help_str(limit)


def test_every_command_of_the_modules_is_in_the_table() -> None:
    import importlib

    for module in {entry.module for entry in COMMANDS.values()}:
        for command in importlib.import_module(f"ferry.cli.{module}").COMMANDS:
            entry = COMMANDS.get(command.name or "")
            assert entry is not None and entry.module == module, command.name


def test_help_groups_the_commands_with_their_whole_summaries() -> None:
    """Issue 30: jobs, checkpoints, process-level and tools apart, no summary cut to "..."."""
    result = CliRunner().invoke(main, ["--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = result.output
    headings = [text.index(GROUPS[group]) for group in GROUPS]
    assert headings == sorted(headings), headings
    for name, entry in COMMANDS.items():
        line = next(line for line in text.splitlines() if line.split()[:1] == [name])
        assert line.split(None, 1)[1] == entry.help, line  # whole, on one line where it fits
        section = max(i for i, at in enumerate(headings) if at < text.index(line))
        assert list(GROUPS)[section] == entry.group, name


@pytest.mark.parametrize(
    "argv",
    [["--help"], [], ["run", "--help"]],
    ids=["help", "bare", "run-help"],
)
def test_help_and_completion_import_no_torch(argv: list[str]) -> None:
    code = (
        "import sys\nfrom ferry.cli import main\n"
        f"sys.argv = ['ferry', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: ferry" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ("ferry ch", ["chaos", "checkpoint"]),
        ("ferry pro", ["process"]),  # the group; its commands' old names are hidden
        ("ferry su", []),
        ("ferry process ", ["suspend", "wake", "state", "dump", "restore"]),  # as its --help orders them
    ],
)
def test_completion_lists_commands_without_torch(words: str, expected: list[str]) -> None:
    code = (
        "import sys\nfrom ferry.cli import main\n"
        "try:\n    main(prog_name='ferry')\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, file=sys.stderr)\n"
    )
    cword = str(len(words.split()) - (0 if words.endswith(" ") else 1))
    env = {**os.environ, "COMP_WORDS": words, "COMP_CWORD": cword, "_FERRY_COMPLETE": "bash_complete"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.stdout.split() == [f"plain,{name}" for name in expected], proc.stdout
    assert proc.stderr.strip() == "False", proc.stderr
