"""Run training scripts in real subprocesses and compare their results bitwise."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forked import run_forked

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).parents[2]


def env_for(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env.update(FERRY_HOME=str(home), PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1", **extra)
    return env


def run(
    script: str,
    out: Path,
    args: list[str],
    env: dict[str, str],
    *,
    timeout: float = 180,
    new_session: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run a training script to its end, as a child of the fork server (forkserver.py):
    a real process with real signals and exit codes, minus the interpreter start-up."""
    argv = [str(SCRIPTS / script), "--out", str(out), *args]
    return run_forked(argv, env, timeout=timeout, new_session=new_session)


def outputs(out: Path) -> dict[str, str]:
    return {name: (out / name).read_text() for name in ("losses.txt", "params.txt")}


def assert_same(reference: Path, resumed: Path) -> None:
    """Every per-step loss and every parameter bit equal; on failure show the first diff."""
    ref, got = outputs(reference), outputs(resumed)
    for name in ref:
        if ref[name] != got[name]:
            a, b = ref[name].splitlines(), got[name].splitlines()
            first = next(
                (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
            )
            raise AssertionError(
                f"{name} differs at line {first + 1} ({len(a)} vs {len(b)} lines):\n"
                f"  reference: {a[first][:120] if first < len(a) else '<end>'}\n"
                f"  resumed:   {b[first][:120] if first < len(b) else '<end>'}"
            )


def job_status(job: Path) -> dict[str, Any]:
    """A job's status.json, or {} while it does not exist yet."""
    from ferry.runtime.jobdir import JobDir

    return JobDir(str(job)).status()


def train_command(out: Path, *args: str) -> list[str]:
    """The explicit-mode training script, as a command line."""
    return [sys.executable, str(SCRIPTS / "train_explicit.py"), "--out", str(out), *args]


def wait_for(
    what: str, predicate: Callable[[], Any], proc: subprocess.Popen[str], timeout: float = 60
) -> None:
    """Poll ``predicate`` while ``ferry run`` (``proc``) lives; fail with its stderr otherwise."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"ferry run exited ({proc.returncode}) before {what}:\n{stderr_of(proc)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{stderr_of(proc)}")
        time.sleep(0.05)


def stderr_of(proc: subprocess.Popen[str]) -> str:
    """What a failed ``ferry run`` said, after ending it and everything it started: a worker
    left behind holds the output pipes open, and reading them would never end."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # its group, when it was started in a session of its own
    proc.kill()
    try:
        return proc.communicate(timeout=30)[1] or ""
    except subprocess.TimeoutExpired:
        return "(its output pipes are held open by a process that outlived it)"


def pid_of_rank(script: str, rank: int, out: Path) -> int | None:
    """The pid of rank ``rank`` (torchrun's ``RANK``/``LOCAL_RANK``) of the run of ``script``
    that writes to ``out``: other tests run the same script meanwhile (the torchrun soak), and
    must not get what a test sends its own run."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = script.encode() in cmd and str(out).encode() in cmd
        if ours and f"RANK={rank}".encode() in env and f"LOCAL_RANK={rank}".encode() in env:
            return int(entry.name)
    return None
