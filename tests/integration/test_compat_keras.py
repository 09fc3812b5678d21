"""Keras 3 ``model.fit`` (torch backend) under `ferry run`, never interrupted, is the plain
run (issue 26, "do no harm"): same exit code, same printed lines on both streams, same files
(CSVLogger's log and every ModelCheckpoint weight file byte for byte), same final weights
and optimizer state, and it exits at once although its DataLoader keeps a pool of two
persistent workers that ferry makes ignore the stop signals. Before ferry knew Keras,
zero-code mode started each iterator's sampler as soon as Keras made it (Keras makes the
next epoch's iterator early and throws it away), which moved the global random stream:
from epoch 2 on, every shuffle, loss and weight differed. Keras has no multi-process
training mode on the torch backend that users commonly use, so there is no multi-process
case here (docs/integrations.md, the framework table)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import compat
from keras_runs import argv, env, plain_reference, scrub

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="pip install 'gpuferry[keras]'"),
]


def test_uninterrupted_fit_under_ferry_is_the_plain_run(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ref = plain_reference(tmp_path_factory, "loader", "--workers", "2")
    got = compat.under_ferry(
        argv("loader", "--workers", "2"), tmp_path / "job", env(tmp_path / "home"), scrub=scrub
    )
    compat.assert_same(ref, got)
    assert got.exit_lag < ref.exit_lag + 10, (ref.exit_lag, got.exit_lag)
