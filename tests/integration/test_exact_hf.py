"""Exact inside the Hugging Face Trainer's own loop (issue 28): a run_clm.py-style job
(scripts/hf_clm.py: GPT-2 from a config, synthetic blocks, 2 batches a step, a collator
that draws random numbers, evaluation, checkpoint folders, best model, early stopping)
stopped by SIGTERM under `ferry run` and resumed must end as the plain uninterrupted run:
every printed loss and evaluation line (across the runs), the same number of steps, the
final ``train_loss``, ``trainer_state.json`` (``log_history``, best metric and checkpoint)
and the Trainer's checkpoint folders bit for bit (model, optimizer, scheduler, RNG), the
final model and optimizer state bit for bit. Only wall-clock figures are set aside.

The stops are SIGTERMs the job sends itself at an exact point (``HF_STOP_AT``); what a stop
ends in is ferry's checkpoint and exit 85 whichever way it comes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import compat
import hfjobs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]  # several runs of a slow import
pytest.importorskip("transformers")


def _resumed_steps(outcome: compat.Outcome) -> list[int]:
    found = (re.search(r"resumed from \S+ at step (\d+)", line) for line in outcome.ferry)
    return [int(m.group(1)) for m in found if m]


def test_stopped_mid_epoch_then_in_an_evaluation_at_an_epoch_boundary_across_both_modes(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """One process, ``enable_jit_checkpoint`` on, stopped twice in a row: zero-code mode after
    step 3 (mid-epoch: its next step's two batches, and the one accelerate's DataLoaderShard
    holds ahead, were fetched and collated before the checkpoint), resumed under the
    explicit callback and stopped inside the evaluation after step 10, the end of epoch 2
    (the checkpoint is the epoch boundary), finished in zero-code mode. Each mode resumes the
    other's checkpoint; the Trainer's own SIGTERM handler (JIT checkpoint) never ends the job
    with exit 0."""
    ref = hfjobs.reference(tmp_path_factory, hfjobs.argv(*hfjobs.JIT))
    zero_code, explicit = hfjobs.argv(*hfjobs.JIT), hfjobs.argv(*hfjobs.JIT, "--explicit", "true")
    got, codes = hfjobs.lineage(
        tmp_path / "run", tmp_path / "home", [zero_code, explicit, zero_code], HF_STOP_AT="step:3,eval:10"
    )
    assert codes == [85, 85, 0], "\n".join(got.log[-40:])
    assert _resumed_steps(got) == [3, 10]
    # run 3 (zero-code) took ferry's checkpoint over the folder the script found, as run_clm.py does
    assert "ferry: resuming from ferry's checkpoint at step 10, not from out/checkpoint-10" in got.ferry
    assert not any("error" in line for line in got.ferry), got.ferry
    assert not any("single sample" in line for line in got.stderr)
    assert got.exit_lag < 10, f"the resumed job exited {got.exit_lag:.1f} s after its last line"
    compat.assert_same(ref, got, streams=("stdout",))


def test_torchrun_two_ranks_stopped_on_one_rank_mid_epoch_then_in_an_evaluation(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``torchrun --nproc_per_node 2`` on gloo (DDP, each rank its shard of every batch, 3
    steps an epoch: 2, 2 and 1 batches), zero-code mode: SIGTERM to rank 1 alone after step 2
    (mid-epoch), then inside the evaluation after step 6 (the end of epoch 2); both ranks
    stop at that step, and the resumed job ends as the plain one (each rank's running loss
    is its own: the logged losses and ``train_loss`` are means over the ranks)."""
    command = hfjobs.argv(torchrun=True)
    ref = hfjobs.reference(tmp_path_factory, command)
    got, codes = hfjobs.lineage(
        tmp_path / "run",
        tmp_path / "home",
        [command] * 3,
        HF_STOP_AT="step:2,eval:6",
        HF_STOP_RANK="1",
        HF_STEP_SLEEP="0.6",
    )
    assert codes == [85, 85, 0], "\n".join(got.log[-40:])
    assert _resumed_steps(got) == [2, 6]
    assert got.exit_lag < 10, f"the resumed job exited {got.exit_lag:.1f} s after its last line"
    compat.assert_same(ref, got, streams=("stdout",))
