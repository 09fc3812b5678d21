"""Shared by test_compat_lightning.py and test_exact_lightning.py: the plain reference runs
of ``scripts/lightning_fit.py`` (one process, and ``strategy="ddp"`` on 2 CPU processes),
computed once per session, and what the comparisons leave aside."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

import compat
from trainrun import SCRIPTS

DDP = ["--strategy", "ddp", "--devices", "2"]
PACE = ["--sleep", "0.3", "--val-sleep", "0.25"]
"""Seconds per batch in the stopped runs: a stop lands inside the batch it was sent in (the
output does not change)."""
_CHECKPOINTED = re.compile(r"checkpointed at step (\d+), exiting with 85")


def argv(*extra: str) -> list[str]:
    return [sys.executable, str(SCRIPTS / "lightning_fit.py"), *extra]


def env(home: Path, **extra: str) -> dict[str, str]:
    return compat.env_for(home, OMP_NUM_THREADS="1", **extra)


def without_ckpt_files(outcome: compat.Outcome) -> dict[str, str]:
    """Lightning's .ckpt files name the working folder inside; the script prints a digest of
    each one's whole content with that folder made relative (compared with stdout)."""
    return {name: text for name, text in outcome.files.items() if not name.endswith(".ckpt")}


def stopped_at(outcome: compat.Outcome) -> int:
    """The step of the one checkpoint a stopped run committed before it exited 85."""
    assert outcome.returncode == 85, "\n".join(outcome.log[-30:])
    found = [int(m.group(1)) for line in outcome.ferry + outcome.log if (m := _CHECKPOINTED.search(line))]
    assert len(set(found)) == 1, outcome.log[-30:]
    return found[0]


def _plain(tmp: Path, *extra: str) -> compat.Outcome:
    ref = compat.plain(argv(*extra), tmp / "run", env(tmp / "home"))
    assert ref.returncode == 0, "\n".join(ref.log[-30:])
    return ref


@pytest.fixture(scope="session")
def plain_one(tmp_path_factory: pytest.TempPathFactory) -> compat.Outcome:
    return _plain(tmp_path_factory.mktemp("lightning-plain"))


@pytest.fixture(scope="session")
def plain_ddp(tmp_path_factory: pytest.TempPathFactory) -> compat.Outcome:
    return _plain(tmp_path_factory.mktemp("lightning-plain-ddp"), *DDP)


needs_lightning = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None, reason="pip install 'gpuferry[lightning]'"
)
