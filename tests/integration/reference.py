"""One uninterrupted run of train_explicit.py per test session, shared by the scheduler
tests (test_slurm, test_htcondor, test_kubernetes): each compares its resumed run to it."""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest

from trainrun import env_for, run


@pytest.fixture
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train_explicit.py's defaults, uninterrupted and without ferry run; computed once and
    kept under the session's base temp folder (a lock guards against parallel workers)."""
    base = tmp_path_factory.getbasetemp() / "scheduler-reference"
    base.mkdir(exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = base / "run"
        if not (out / "params.txt").exists():
            proc = run("train_explicit.py", out, [], env_for(base / "home", FERRY_DIR=str(base / "ck")))
            assert proc.returncode == 0, proc.stderr
    return out
