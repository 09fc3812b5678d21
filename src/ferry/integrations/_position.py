"""The data position of a DataLoader that a high-level trainer iterates.

Trainers prefetch (Lightning's data fetcher and accelerate's ``DataLoaderShard`` hold one
batch ahead, Keras makes the next epoch's iterator early), so the number of batches a
loader has handed out is not the number trained on, and how many random numbers a trainer
draws around an epoch boundary (each iter() draws a worker base seed) is its own business.
So the callbacks count trained batches themselves (``batch_done``), and each epoch's order
is drawn from a random state of its own:
the loader's index sampler is replaced, once, by a wrapper that seeds each epoch's shuffle
from a generator saved with the position, and after a resume draws the interrupted epoch's
order again and skips the trained batches at the sampler (their samples are never loaded).
The global random state seen by training is left alone (ferry saves and restores it).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from ferry.errors import UnsupportedStateError, bug
from ferry.state.epoch_replay import apply_epoch_rng, capture_epoch_rng, loader_generators
from ferry.state.rng import own


def _base(loader: Any) -> DataLoader[Any]:
    """The torch DataLoader under a wrapper (accelerate's adapters keep it as ``base_dataloader``)."""
    base = getattr(loader, "base_dataloader", loader)
    if not isinstance(base, DataLoader):
        raise UnsupportedStateError(
            f"ferry can resume the data position of a torch DataLoader, not of a {type(loader).__name__}; "
            "pass the DataLoader that training iterates"
        )
    return base


def _seed_all(loader: DataLoader[Any], seed: int) -> None:
    """Seed everything a sampler may draw from (CPU only: CUDA generators are left alone)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.set_rng_state(torch.Generator().manual_seed(seed).get_state())
    for gen in loader_generators(loader).values():
        gen.manual_seed(seed)


class _Batches:
    """Stands in for the loader's batch sampler (or sampler); see the module docstring."""

    def __init__(self, inner: Any, position: LoaderPosition) -> None:
        self.inner, self.position = inner, position

    def __iter__(self) -> Iterator[Any]:
        # A generator: its body runs at the first batch, so an iterator a trainer makes and
        # throws away (or a multi-worker iterator's extra iter() call) draws nothing.
        pos = self.position
        loader = pos.loader
        if loader is None:
            raise bug("a tracked loader without its DataLoader")
        pending, pos.pending = pos.pending, None
        stash = capture_epoch_rng(loader)
        if pending is None:
            _seed_all(loader, int(torch.randint(0, 2**62, (), generator=pos.order)))
            pos.epoch_rng, skip = capture_epoch_rng(loader), 0
        else:
            pos.epoch_rng, skip = pending["epoch_rng"], int(pending["batch"])
            apply_epoch_rng(loader, pos.epoch_rng)
        it = iter(self.inner)
        # The sampler draws its order at its first item; with nothing to skip that first
        # batch is drawn now and handed out below. Skipped batches are drawn, never loaded.
        head = list(itertools.islice(it, max(skip, 1)))
        # Resumed mid-epoch, the random state of the checkpoint comes back here, at the first
        # batch: the iter() the trainer made after the restore drew a worker seed from it.
        apply_epoch_rng(loader, stash if pending is None else pending["now"])
        pos.batch = skip
        if skip == 0:
            yield from head
        yield from it

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class LoaderPosition:
    """Stateful position of one DataLoader: the batch within the epoch and the epoch's order.

    ``attach`` before the trainer first iterates the loader; ``batch_done`` after each
    trained batch; ``state_dict`` at a safe point. Epochs are counted by the trainer."""

    def __init__(self) -> None:
        self.loader: DataLoader[Any] | None = None
        self.batch = 0
        self.epoch_rng: dict[str, Any] | None = None
        self.pending: dict[str, Any] | None = None
        # Seeds each epoch's order; from the script's seed, so that a fresh run repeats itself.
        self.order = torch.Generator().manual_seed(torch.initial_seed())

    def attach(self, loader: Any) -> None:
        base = _base(loader)
        if self.loader is base:
            return
        attr = "batch_sampler" if base.batch_sampler is not None else "sampler"
        inner = getattr(base, attr)
        if not isinstance(inner, _Batches):
            object.__setattr__(base, attr, _Batches(inner, self))  # DataLoader forbids setattr after init
        self.loader = base

    def batch_done(self) -> bool:
        """Count a trained batch; True when it completed the epoch."""
        self.batch += 1
        return self.loader is not None and self.batch >= len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        # Between two epochs, or before the first (a checkpoint taken before the trainer
        # iterated the loader): nothing of an epoch to skip on resume.
        if self.loader is None or self.batch >= len(self.loader):
            return {"batch": 0, "epoch_rng": None, "order": self.order.get_state()}
        return {
            "batch": self.batch,
            "epoch_rng": self.epoch_rng,
            "order": self.order.get_state(),
            "now": capture_epoch_rng(self.loader),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.order.set_state(own(state["order"]))
        if state["epoch_rng"] is not None:  # None: saved between two epochs
            self.pending = state  # applied when the trainer starts the epoch
