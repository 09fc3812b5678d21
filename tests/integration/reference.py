"""Uninterrupted reference runs, computed once per test session and shared by every test
(and every pytest-xdist worker) that compares a resumed run to the same script and
arguments: the exact-resume matrix, the CLI, launcher and scheduler tests."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from trainrun import env_for, run


def shared_root(factory: pytest.TempPathFactory) -> Path:
    """The session's temporary folder, the same for all xdist workers of one run."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def reference_run(
    factory: pytest.TempPathFactory, script: str = "train_explicit.py", args: tuple[str, ...] = ()
) -> Path:
    """The output folder of ``script args``, run to its end without interruption and without
    `ferry run`; made by the first test that asks, under a lock, and reused. What it printed
    is kept beside it, in ``stdout.txt`` of the returned folder's parent."""
    key = hashlib.sha256(json.dumps([script, list(args)]).encode()).hexdigest()[:16]
    base = shared_root(factory) / "references" / key
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = base / "run"
        if not (base / "complete").exists():
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(base / "ck", ignore_errors=True)
            proc = run(script, out, list(args), env_for(base / "home", FERRY_DIR=str(base / "ck")))
            assert proc.returncode == 0, proc.stderr
            (base / "stdout.txt").write_text(proc.stdout)
            (base / "complete").write_text(json.dumps([script, list(args)]))
    return out


@pytest.fixture
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train_explicit.py's defaults, uninterrupted."""
    return reference_run(tmp_path_factory)
