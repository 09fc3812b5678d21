"""Do no harm, with Lightning (issue 26): an unmodified Lightning script (ModelCheckpoint,
EarlyStopping, CSVLogger, validation, then ``trainer.predict``, whose loader Lightning
re-creates from ``DataLoader.__init__``'s signature) run plain and under ``ferry run``,
uninterrupted: the same exit code, printed lines, metrics and hyperparameter files, the same
content in every Lightning checkpoint, on one process and under ``strategy="ddp"`` (Lightning
runs the script again as rank 1, which ferry arms too, and injects a DistributedSampler)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lightning_runs import DDP, argv, env, needs_lightning, plain_ddp, plain_one, without_ckpt_files

import compat

pytestmark = [pytest.mark.integration, needs_lightning, pytest.mark.timeout(900)]  # Lightning imports slowly
__all__ = ["plain_ddp", "plain_one"]  # session fixtures shared with test_exact_lightning.py


@pytest.mark.parametrize("ddp", [False, True], ids=["one-process", "ddp-2-processes"])
def test_uninterrupted_fit_and_predict_equal_the_plain_run(
    ddp: bool, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    ref: compat.Outcome = request.getfixturevalue("plain_ddp" if ddp else "plain_one")
    got = compat.under_ferry(argv(*(DDP if ddp else [])), tmp_path / "run", env(tmp_path / "home"))
    assert got.returncode == ref.returncode == 0, "\n".join(got.log[-30:])
    assert got.stdout == ref.stdout  # every batch's loss, the weights, predict, checkpoints' content
    assert got.stderr == ref.stderr
    assert without_ckpt_files(got) == without_ckpt_files(ref)
    assert sorted(got.files) == sorted(ref.files)
