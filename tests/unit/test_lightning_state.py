"""What ferry keeps of a Lightning Trainer, in process (integrations/lightning_state.py): the
checkpoint handed back to Lightning, the logger versions pinned, and a CSV writer that
continues its file as it was at the checkpoint. Lightning is not imported: the objects below
have the attributes these functions read, as Lightning's have."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ferry.integrations.lightning_state import csv_continued, hand_over, pin_versions


class _Module:
    CHECKPOINT_HYPER_PARAMS_KEY = "hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "hparams_type"
    hparams = {"lr": 0.01}
    _hparams_name = "kwargs"


class _Trainer:
    lightning_module = _Module()
    datamodule = None


def _saved(validated: bool) -> dict[str, Any]:
    loops = {"fit_loop": {"epoch_loop.state_dict": {"_batches_that_stepped": 12}, "other": 1}}
    return {"checkpoint": {"epoch": 1, "loops": loops}, "validated": validated}


@pytest.mark.parametrize(("validated", "counted"), [(False, 12), (True, 11)])
def test_hand_over_puts_hparams_back_and_counts_a_validated_batch_as_lightning_does(
    validated: bool, counted: int
) -> None:
    """Lightning passes over a validation it restored and counts the batch for its loggers
    then: a batch ferry saved after validation is handed over counted one back."""
    saved = _saved(validated)
    got = hand_over(saved, _Trainer())
    assert got["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"] == counted
    assert got["hyper_parameters"] == {"lr": 0.01} and got["hparams_name"] == "kwargs"
    assert saved["checkpoint"]["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"] == 12


class _Writer:
    """Lightning's CSV writer: made in a folder that holds files, it deletes metrics.csv."""

    def __init__(self, log_dir: str) -> None:
        self.metrics_file_path = os.path.join(log_dir, "metrics.csv")
        if os.path.isdir(log_dir) and os.listdir(log_dir) and os.path.isfile(self.metrics_file_path):
            os.remove(self.metrics_file_path)
        os.makedirs(log_dir, exist_ok=True)
        self.metrics: list[dict[str, Any]] = []
        self.metrics_keys: list[str] = []


class CSVLogger:
    def __init__(self, root: Path, version: int | None = None) -> None:
        self.root, self._version = root, version
        self._experiment: _Writer | None = None

    @property
    def log_dir(self) -> str:
        return str(self.root / f"version_{self._version}")


def test_a_resumed_csv_logger_continues_its_version_folder_and_file(tmp_path: Path) -> None:
    folder = tmp_path / "version_0"
    folder.mkdir()
    (folder / "hparams.yaml").write_text("lr: 0.01\n")
    (folder / "metrics.csv").write_text("epoch,step\n0,1\n0,2\n0,3\n")  # the stopped run flushed row 3
    csv = {"keys": ["epoch", "step"], "rows": [{"epoch": 0, "step": 2}], "length": 15}
    saved = [{"type": "CSVLogger", "version": 0, "csv": csv}]
    logger = CSVLogger(tmp_path, version=1)  # the Trainer asked for the next free version
    pin_versions(saved, [logger])
    assert logger._version == 0
    with csv_continued(saved, [logger]):
        logger._experiment = _Writer(logger.log_dir)
    assert (folder / "metrics.csv").read_text() == "epoch,step\n0,1\n"  # as at the checkpoint
    assert (folder / "hparams.yaml").exists() and not (tmp_path / "version_0.ferry-resume").exists()
    assert logger._experiment.metrics == [{"epoch": 0, "step": 2}]
    assert logger._experiment.metrics_keys == ["epoch", "step"]
