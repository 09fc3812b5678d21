"""The Hugging Face Trainer integration's pieces that need no Trainer: the batches fetched
ahead of a safe point drawn again from their random streams (``_hf_fetches``), with
accelerate's own ``SkipBatchSampler`` doing the skip as the Trainer's resume does; and the
saved progress checked at the edge (``_hf_progress``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset, default_collate

from ferry.errors import CorruptCheckpointError
from ferry.integrations._hf_fetches import SAMPLER, Fetches, FetchLog, attach
from ferry.integrations._hf_progress import TrainerProgress
from ferry.state.rng import GlobalRNG

SkipBatchSampler = pytest.importorskip("accelerate.data_loader").SkipBatchSampler
DATA = TensorDataset(torch.arange(40.0))


def noisy(items: list[Any]) -> torch.Tensor:
    """A collator that draws from the global stream (as an MLM collator's masking does)."""
    (x,) = default_collate(items)
    return x + torch.rand(x.shape)


def test_batches_fetched_before_the_safe_point_come_back_the_same() -> None:
    """An uninterrupted epoch (its order drawn from the global stream, as a sampler without
    a generator does): 4 batches trained, 2 more fetched ahead (as the Trainer's
    gradient-accumulation group and accelerate's look-ahead do), then the safe point. A
    "resumed process" with other streams skips the 4 at the sampler and must fetch the 2
    pending batches and every later one exactly as the uninterrupted epoch did."""
    torch.manual_seed(0)
    log = FetchLog()
    log.keep(3)
    loader = DataLoader(DATA, batch_size=4, collate_fn=noisy, shuffle=True)
    assert attach(loader, log)
    it = iter(loader)
    trained = [next(it) for _ in range(4)]
    ahead = [next(it) for _ in range(2)]
    pending, now = log.pending(), GlobalRNG().state_dict()
    rest = list(it)
    assert sorted(pending) == [SAMPLER, 3, 4, 5]  # the sampler's start, the last three fetches

    torch.manual_seed(123)  # the resumed process: other streams until the restore
    log = FetchLog()
    log.replay_next_epoch(pending)
    loader = DataLoader(DATA, batch_size=4, collate_fn=noisy, shuffle=True)
    attach(loader, log)
    skipping = DataLoader(DATA, batch_sampler=SkipBatchSampler(loader.batch_sampler, 4), collate_fn=noisy)
    again = iter(skipping)
    ahead_again = [next(again) for _ in range(2)]
    GlobalRNG().load_state_dict(now)  # the checkpoint's streams, at the safe point
    rest_again = list(again)
    assert all(torch.equal(a, b) for a, b in zip(ahead, ahead_again, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(rest, rest_again, strict=True))
    assert not any(torch.equal(trained[0], b) for b in ahead_again)


def test_without_the_replay_the_pending_batches_differ() -> None:
    """The check above can fail: the same resume without the recorded streams gives other
    batches (the collator's draws start from the resumed process's streams)."""
    torch.manual_seed(0)
    loader = DataLoader(DATA, batch_size=4, collate_fn=noisy, shuffle=True)
    it = iter(loader)
    ahead = [next(it) for _ in range(6)][4:]
    torch.manual_seed(123)
    skipping = DataLoader(DATA, batch_sampler=SkipBatchSampler(loader.batch_sampler, 4), collate_fn=noisy)
    assert not torch.equal(ahead[0], next(iter(skipping)))


def test_loaders_with_workers_are_left_alone() -> None:
    loader = DataLoader(DATA, batch_size=4, num_workers=2)
    assert not attach(loader, FetchLog())
    assert not isinstance(loader.batch_sampler, Fetches)


def _valid() -> dict[str, Any]:
    return {
        "trainer_state": '{"global_step": 3}',
        "counters": {"_tr_loss": torch.tensor(1.5), "_total_loss_scalar": 2.0},
        "callbacks": {"EarlyStoppingCallback": [{"attributes": {"early_stopping_patience_counter": 1}}]},
        "fetches": {"6": GlobalRNG().state_dict(), "sampler": GlobalRNG().state_dict()},
        "rng": GlobalRNG().state_dict(),
        "epoch_rng": None,
    }


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("trainer_state", "not json"),
        ("trainer_state", '{"epoch": 1}'),
        ("counters", {"_tr_loss": "1.5"}),
        ("counters", {"os.system": 1.0}),
        ("callbacks", {"EarlyStoppingCallback": "x"}),
        ("fetches", {"six": {}}),
        ("rng", [1, 2]),
    ],
)
def test_a_damaged_progress_is_refused_with_a_way_out(field: str, value: Any) -> None:
    progress = TrainerProgress()
    progress.load_state_dict(_valid())
    assert progress.resuming
    refused = rf"hf_progress\.{field} .*resume from another checkpoint"
    with pytest.raises(CorruptCheckpointError, match=refused):
        TrainerProgress().load_state_dict({**_valid(), field: value})


def test_the_progress_of_ferrys_first_hf_callback_still_loads() -> None:
    """Its checkpoints hold the TrainerState only: they resume, without the running loss."""
    progress = TrainerProgress()
    progress.load_state_dict({"trainer_state": '{"global_step": 17}'})
    assert progress.saved is not None and progress.saved["counters"] == {} and progress.saved["rng"] is None
    progress.step_begins()  # the restore point: nothing to put back but the state
    assert not progress.resuming
