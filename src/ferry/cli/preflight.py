"""What ``ferry run`` and ``ferry resume`` check before a supervisor starts, beyond their
options' own types: a run inside a run, a script named without its interpreter, places that
cannot be written. Each is a ConfigError (exit 2) in one line that says what to do."""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Sequence

from ferry.cli.places import check_writable
from ferry.errors import ConfigError
from ferry.runtime.jobdir import ferry_home


def refuse_nested(name: str, command: Sequence[str]) -> None:
    """ConfigError for ``ferry run`` (``name``: or ``ferry resume``) started by the command of a
    live ``ferry run``: the inner supervisor would take the outer job's settings (its id, its
    root) from the environment and fight it for them; the outer one makes the command
    preemptible already."""
    pid = os.environ.get("FERRY_SUPERVISOR_PID", "")
    if not pid.isdigit() or int(pid) not in _ancestors():
        return  # a stale variable (a shell that outlived its job, its pid reused): no fight
    job = os.environ.get("FERRY_JOB_ID")
    under = f"job {job}" if job else "a job"
    plain = f"run {shlex.join(command)} there without `{name}`, or " if command else ""
    raise ConfigError(
        f"{name} inside ferry run: this runs under {under} (ferry run pid {pid}), which checkpoints "
        f"and resumes its command already; {plain}start {name} outside that job"
    )


def _ancestors() -> set[int]:
    """This process's parent, its parent's, ... up to init, from /proc."""
    found, pid = set(), os.getppid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


def refuse_bare_script(command: Sequence[str], path: str | None) -> None:
    """ConfigError, with the command that works, for ``ferry run -- train.py``: a file of this
    folder named without its interpreter or ``./``, which no shell runs either."""
    argv0 = command[0] if command else ""
    if argv0 and os.sep not in argv0 and os.path.isfile(argv0) and shutil.which(argv0, path=path) is None:
        fix = f"python {shlex.join(command)}" if argv0.endswith(".py") else f"./{shlex.join(command)}"
        raise ConfigError(
            f"cannot run {argv0!r}: command not found on PATH (a file of this folder is not looked "
            f"for there); run it as `ferry run -- {fix}`"
        )


def check_places(checkpoint_dir: str) -> None:
    """The checkpoint root and FERRY_HOME, which the run creates and writes: ConfigError
    (exit 2) for one this user cannot write, before any of it is touched."""
    check_writable(checkpoint_dir, "the checkpoint root", "give --dir a folder you can write")
    check_writable(ferry_home(), "FERRY_HOME", "set FERRY_HOME to a folder you can write")
