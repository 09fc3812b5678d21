"""Lightning's own loop under ferry, stopped and resumed (issue 28; issue 26 item 3).

One public-style script (``scripts/lightning_fit.py``: ModelCheckpoint top-2 and last,
EarlyStopping, CSVLogger, validation twice an epoch, ``on_save_checkpoint`` hooks, then
``predict``). Each lineage stops it several times (mid-epoch, during validation, at the end
of an epoch) and compares the end with the plain run: every printed line (the stopped runs'
lines followed by the resumed ones'), stderr, the metrics and hyperparameter files, the final
weights and optimizer state, and the content of every checkpoint Lightning wrote (weights,
optimizer, schedulers, loops, callbacks). Each SIGTERM went where Lightning's own handler
would have taken it: every stop ends in a committed checkpoint and exit 85 (Lightning's
handler ended ``fit`` with exit 0 and no checkpoint)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lightning_runs import (
    DDP,
    PACE,
    argv,
    env,
    needs_lightning,
    plain_ddp,
    plain_one,
    stopped_at,
    without_ckpt_files,
)

import compat

pytestmark = [pytest.mark.integration, needs_lightning, pytest.mark.timeout(900)]  # Lightning imports slowly
__all__ = ["plain_ddp", "plain_one"]  # session fixtures shared with test_compat_lightning.py


def _same_end(final: compat.Outcome, printed: list[str], ref: compat.Outcome) -> None:
    assert final.returncode == 0, "\n".join(final.log[-30:])
    assert sum("resumed from" in line for line in final.log) == 1  # stderr, ferry's lines included
    assert printed + final.stdout == ref.stdout  # nothing repeated, nothing lost
    assert final.stderr == ref.stderr  # no warning the plain run does not print
    assert without_ckpt_files(final) == without_ckpt_files(ref)  # metrics.csv, one version folder
    assert sorted(final.files) == sorted(ref.files)
    assert final.exit_lag < ref.exit_lag + 10  # exits as the plain run does (Lightning's own exit is slow)


def test_stopped_three_times_in_either_mode_resumes_to_the_plain_run(
    plain_one: compat.Outcome, tmp_path: Path
) -> None:
    """Zero-code mode (``ferry run``) stopped mid-epoch, where no validation follows the batch;
    resumed by the explicit ``FerryCallback`` (plain python) and stopped during the mid-epoch
    validation; resumed in zero-code mode and stopped at the end of an epoch, after its
    validation; resumed by the callback to the end: a checkpoint of either mode resumes under
    the other, and the four runs together are the plain run."""
    work = tmp_path / "run"
    explicit = env(tmp_path / "home", FERRY_DIR=str(work / compat.CHECKPOINTS), FERRY_JOB_ID="compat")
    zero_code = env(tmp_path / "home")
    printed: list[str] = []
    steps = []
    for run, stop in [
        ("zero-code", compat.StopAfter("stdout", 2, containing=" loss ")),
        ("callback", compat.StopAfter("stdout", 1, containing="validating at step 12")),
        ("zero-code", compat.StopAfter("stdout", 1, containing="batch 7 step 16 ")),
    ]:
        if run == "zero-code":
            got = compat.under_ferry(argv(*PACE), work, zero_code, stop=stop)
        else:
            got = compat.plain(argv(*PACE, "--callback"), work, explicit, stop=stop)
        steps.append(stopped_at(got))
        printed += got.stdout
        assert "Received SIGTERM" not in "\n".join(got.stderr)  # Lightning's handler never ran
    assert steps[0] % 4 != 0 and steps[1:] == [12, 16], steps  # validation after steps 4, 8, ...
    _same_end(compat.plain(argv(*PACE, "--callback"), work, explicit), printed, plain_one)


def test_ddp_stopped_during_validation_then_at_an_epoch_end_resumes_to_the_plain_run(
    plain_ddp: compat.Outcome, tmp_path: Path
) -> None:
    """``strategy="ddp"`` on 2 CPU processes (Lightning runs the script again as rank 1, with a
    DistributedSampler): stopped during the mid-epoch validation, then at the end of epoch 1;
    both ranks checkpoint the same step; rank 1's own lines (``rank1.log``) are compared too."""
    work, zero_code = tmp_path / "run", env(tmp_path / "home")
    printed: list[str] = []
    steps = []
    for stop in [
        compat.StopAfter("stdout", 1, containing="validating at step 6"),
        compat.StopAfter("stdout", 1, containing="batch 3 step 8 "),
    ]:
        got = compat.under_ferry(argv(*DDP, *PACE), work, zero_code, stop=stop)
        steps.append(stopped_at(got))
        printed += got.stdout
    assert steps == [6, 8]
    _same_end(compat.under_ferry(argv(*DDP, *PACE), work, zero_code), printed, plain_ddp)
