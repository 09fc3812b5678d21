"""Random augmentation in DataLoader workers, replayed mid-epoch (state/worker_rng.py), in
process: an interrupted pass takes k batches and the loader's position; a "fresh process"
(other seeds, a new loader) resumes from it and must get bitwise the batches the
uninterrupted run had left, and with persistent workers the next epoch's too."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from ferry.state.loader import Hooks, WorkerInit, protect_workers, track_loader, untrack_all
from ferry.state.rng import GlobalRNG
from ferry.state.worker_rng import TagCollate


class Augmented(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> torch.Tensor:
        noise = torch.rand(1).item() + random.random() + float(np.random.rand())
        return torch.tensor([float(i), noise])


def make(persistent: bool) -> DataLoader[torch.Tensor]:
    return DataLoader(Augmented(), batch_size=4, shuffle=True, num_workers=2, persistent_workers=persistent)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@pytest.fixture(autouse=True)
def clean_hooks() -> Iterator[None]:
    untrack_all()
    yield
    untrack_all()


def tracked(loader: DataLoader[torch.Tensor]) -> Any:
    tracker = track_loader("loader", loader, Hooks())
    protect_workers(loader, [])
    return tracker


@pytest.mark.parametrize(("persistent", "k"), [(False, 3), (True, 5), (True, 8 + 1)])
def test_resumed_workers_make_the_same_batches(persistent: bool, k: int) -> None:
    """k batches taken (8 an epoch); persistent workers are checked into the next epoch,
    and resumed in it (their states carry over from the first)."""
    epochs = 2 if persistent else 1
    seed_all(1)
    plain = make(persistent)
    reference = [b for _ in range(epochs) for b in plain]
    del plain

    seed_all(1)
    loader = make(persistent)
    tracker = tracked(loader)
    assert isinstance(loader.collate_fn, TagCollate) and isinstance(loader.worker_init_fn, WorkerInit)
    taken: list[torch.Tensor] = []
    while len(taken) < k:
        it = iter(loader)
        taken += [b for _, b in zip(range(k - len(taken)), it, strict=False)]
    position, rng = tracker.position(), GlobalRNG().state_dict()
    assert sorted(position["worker_rng"]) == ["0", "1"]  # both workers made consumed batches
    del it, loader
    untrack_all()

    seed_all(2)  # the fresh process seeds otherwise; the checkpoint puts everything back
    loader = make(persistent)
    resumed = tracked(loader)
    resumed.resume_at, resumed.relative = position, True
    GlobalRNG().load_state_dict(rng)
    rest = [b for _ in range(epochs - int(position["epoch"])) for b in loader]
    got = taken + rest
    assert len(got) == len(reference)
    assert all(torch.equal(a, b) for a, b in zip(got, reference, strict=True))
