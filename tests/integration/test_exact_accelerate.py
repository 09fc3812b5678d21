"""A training loop written with accelerate's own API (``scripts/accelerate_loop.py``:
``Accelerator(gradient_accumulation_steps=2)``, ``prepare``, ``accumulate``, a per-step LR
schedule, an evaluation each epoch, ``save_state``), under `ferry run` in zero-code mode.

- Never interrupted, it is the plain run: the same exit code, printed lines and files
  (``metrics.jsonl``, the ``save_state`` folder byte for byte).
- Stopped by a SIGTERM after an odd batch (in the middle of a gradient accumulation), in
  epoch 1 and again in epoch 2, and resumed each time, it is the plain run too: every
  printed line (epoch, ``enumerate`` index, optimizer step count, loss), the files, the final
  weights, and no warning. Before (an audit of the frameworks users run, 2026-11-27), the
  accumulation's count, which lives in the ``Accelerator`` (``Accelerator.step``), came back
  as 0, so every later sync came one batch off and the losses and final weights differed
  while ferry said "resumed from ... at step 5" (``autotrack/accelerators.py``); and the
  loop's ``enumerate`` index started over, the loader being iterated through accelerate's
  ``DataLoaderShard.__iter__``, a library generator (``frames.loader_generator``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import compat
from trainrun import SCRIPTS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="pip install accelerate"),
]

ARGV = [sys.executable, str(SCRIPTS / "accelerate_loop.py")]


def _env(home: Path, **extra: str) -> dict[str, str]:
    return compat.env_for(home, OMP_NUM_THREADS="1", **extra)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> compat.Outcome:
    base = tmp_path_factory.mktemp("accelerate-plain")
    ref = compat.plain(ARGV, base / "run", _env(base / "home"))
    assert ref.returncode == 0, "\n".join(ref.log[-30:])
    return ref


def test_an_uninterrupted_accelerate_loop_is_the_plain_run(plain: compat.Outcome, tmp_path: Path) -> None:
    got = compat.under_ferry(ARGV, tmp_path / "run", _env(tmp_path / "home"))
    compat.assert_same(plain, got)


def test_stopped_twice_in_the_middle_of_an_accumulation_resumes_to_the_plain_run(
    plain: compat.Outcome, tmp_path: Path
) -> None:
    stops = _env(tmp_path / "home", ACC_STOP_AT="5,17")  # 12 batches an epoch, 2 a step
    runs = [compat.under_ferry(ARGV, tmp_path / "run", stops) for _ in range(3)]
    said = [line for run in runs for line in run.ferry]
    assert [run.returncode for run in runs] == [85, 85, 0], "\n".join(said)
    assert not [line for line in said if "warning" in line], "\n".join(said)
    printed = [line for run in runs for line in run.stdout]
    assert printed == plain.stdout  # every batch's index, step count and loss; the final weights
    assert runs[-1].files == plain.files  # metrics.jsonl, the save_state folder
    assert sum("resumed from" in line for line in said) == 2, "\n".join(said)
    # ferry's own step count too: the evaluation loader, built by the same prepare() call,
    # took over as the training loader at the first evaluation (it said 16 for 17 here)
    checkpointed = [line for line in said if "checkpointed at step" in line]
    assert [line.split("checkpointed at step ")[1].split(",")[0] for line in checkpointed] == ["5", "17"]
