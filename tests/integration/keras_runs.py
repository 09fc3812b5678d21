"""Runs of ``scripts/keras_fit.py`` for the Keras tests (test_compat_keras.py,
test_exact_keras.py): the plain uninterrupted run of each kind of data, made once per test
session (and shared by the xdist workers, under a lock), and a lineage of runs in one folder
merged into what the user sees of it as a whole."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import re
import sys
from pathlib import Path

import pytest

import compat
from reference import shared_root
from trainrun import SCRIPTS

SCRIPT = str(SCRIPTS / "keras_fit.py")
_TIMES = re.compile(r" - \d+s - \d+(?:s|ms|us)/step")


def scrub(name: str, text: str) -> str:
    """The wall-clock figures of Keras's epoch lines ("- 1s - 66ms/step") vary run to run."""
    return _TIMES.sub("", text) if name == "stdout" else text


def argv(data: str, *extra: str) -> list[str]:
    return [sys.executable, SCRIPT, "--data", data, *extra]


def env(home: Path, **extra: str) -> dict[str, str]:
    return compat.env_for(home, KERAS_BACKEND="torch", **extra)


def plain_reference(factory: pytest.TempPathFactory, data: str, *extra: str) -> compat.Outcome:
    """``keras_fit.py --data DATA EXTRA...`` run plain to its end, once per session."""
    base = shared_root(factory) / "keras-references" / "_".join((data, *extra))
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = base / "outcome.json"
        if not saved.exists():
            ref = compat.plain(argv(data, *extra), base / "run", env(base / "home"), scrub=scrub)
            assert ref.returncode == 0, "\n".join(ref.log[-40:])
            saved.write_text(json.dumps(dataclasses.asdict(ref)))
        return compat.Outcome(**json.loads(saved.read_text()))


def merged(runs: list[compat.Outcome]) -> compat.Outcome:
    """A lineage (stopped, ..., resumed to the end) as the user sees it: everything printed,
    in order; the files as the last run left them; the last run's exit code."""
    last = runs[-1]
    return dataclasses.replace(
        last,
        stdout=[line for run in runs for line in run.stdout],
        stderr=[line for run in runs for line in run.stderr],
        ferry=[line for run in runs for line in run.ferry],
        log=[line for run in runs for line in run.log],
    )


def resumed_at(runs: list[compat.Outcome]) -> list[int]:
    """The step each run resumed from (ferry's "resumed from ... at step N")."""
    found = []
    for run in runs:
        for line in run.ferry:
            hit = re.search(r"resumed from \S+ at step (\d+)", line)
            if hit:
                found.append(int(hit.group(1)))
    return found
