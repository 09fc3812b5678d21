"""Keras 3 ``model.fit`` (torch backend) stopped and resumed is the plain uninterrupted run
(issue 28): every line it printed (its per-epoch lines, ModelCheckpoint's, EarlyStopping's
and ReduceLROnPlateau's messages, the History), every file it wrote (CSVLogger's log, the
ModelCheckpoint weight files per epoch, per 7 batches and best-only, byte for byte) and the
final digest of every model and optimizer variable (the step count included) are equal.

The script (``scripts/keras_fit.py``) has no ferry code, but for ``--ferry-callback``. Its
stops are real SIGTERMs it sends itself after a given training or validation batch
(``KERAS_STOP_AT``), so each stop lands on the same step on a busy machine too. Three
lineages, one per kind of data ``fit`` takes:

- a torch ``DataLoader`` with two persistent workers, zero-code: stopped inside epoch 2
  (step 17), then during the validation of epoch 2: twice in a row, mid-epoch and during
  evaluation (each resumed process skips the trained batches at the sampler of the worker
  pool Keras made before the restore, and exits at once: the pool is shut down);
- NumPy arrays, zero-code, stopped after the last batch of epoch 2 (the epoch boundary),
  resumed with the explicit callback as a plain ``python`` run;
- a ``keras.utils.PyDataset``, stopped under ``ferry run`` with the explicit callback inside
  epoch 2, resumed in zero-code mode.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import compat
from keras_runs import argv, env, merged, plain_reference, resumed_at, scrub

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="pip install 'gpuferry[keras]'"),
]


def _check(ref: compat.Outcome, runs: list[compat.Outcome], codes: list[int], steps: list[int]) -> None:
    assert [r.returncode for r in runs] == codes, "\n".join(runs[-1].log[-40:])
    assert resumed_at(runs) == steps, "\n".join(line for r in runs for line in r.ferry)
    said = [line for r in runs for line in r.ferry if "with another command line" not in line]
    assert not [line for line in said if "warning" in line or "error" in line], "\n".join(said)
    compat.assert_same(ref, merged(runs), streams=("stdout",))
    # each run exits as soon as the plain one does (Keras's own interpreter exit takes seconds)
    assert max(r.exit_lag for r in runs) < ref.exit_lag + 10, (ref.exit_lag, [r.exit_lag for r in runs])


def test_loader_stopped_mid_epoch_then_during_validation(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ref = plain_reference(tmp_path_factory, "loader", "--workers", "2")
    stops = env(tmp_path / "home", KERAS_STOP_AT="train:17,val:8")
    loader = argv("loader", "--workers", "2")
    runs = [compat.under_ferry(loader, tmp_path / "job", stops, scrub=scrub) for _ in range(3)]
    # the second stop: during the validation of epoch 2, served before epoch 3's first step
    _check(ref, runs, [85, 85, 0], [17, 24])


def test_arrays_stopped_at_the_epoch_boundary_resume_under_the_explicit_callback(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ref = plain_reference(tmp_path_factory, "array")
    work = tmp_path / "job"
    stops = env(tmp_path / "home", KERAS_STOP_AT="train:24")
    first = compat.under_ferry(argv("array"), work, stops, scrub=scrub)
    explicit = {**stops, "FERRY_DIR": str(work / compat.CHECKPOINTS), "FERRY_JOB_ID": "compat"}
    second = compat.plain(argv("array", "--ferry-callback"), work, explicit, scrub=scrub)
    _check(ref, [first, second], [85, 0], [24])


def test_pydataset_stopped_under_the_explicit_callback_resumes_in_zero_code_mode(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ref = plain_reference(tmp_path_factory, "pydataset")
    stops = env(tmp_path / "home", KERAS_STOP_AT="train:17")
    first = compat.under_ferry(argv("pydataset", "--ferry-callback"), tmp_path / "job", stops, scrub=scrub)
    second = compat.under_ferry(argv("pydataset"), tmp_path / "job", stops, scrub=scrub)
    _check(ref, [first, second], [85, 0], [17])
