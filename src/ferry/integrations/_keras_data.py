"""The data position of a Keras 3 ``fit`` on the torch backend.

Whatever ``fit`` is given (a torch ``DataLoader``, NumPy arrays, a ``keras.utils.PyDataset``),
its torch epoch iterator draws batches from a torch ``DataLoader``: the user's, or one Keras
builds per epoch (arrays: a random batch sampler over the global torch RNG; a PyDataset: an
iterable dataset over the PyDataset's items, shuffled with Python's ``random``). Keras makes
the next epoch's iterator early (and throws it away again without ``steps_per_epoch``), so
the order is drawn from whatever the random streams hold at the *first batch*, not at
``iter()``. So for the loader in use ``Position`` keeps the random state just before
``iter()`` (``made``, worker seeds come from it), just before the first batch (``first``,
the sampler's order and a PyDataset's shuffle come from it) and how many batches were
taken. Resuming (``replay``) builds the iterator from ``made``, draws the order from
``first``, skips the taken batches at the sampler (indices drawn, samples never loaded; a
loader without a sampler, a PyDataset's, reads and drops them) and puts back the random
state of the checkpoint. A fresh iterator is left entirely alone: under ferry, ``fit``
draws exactly the random numbers it draws without it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from ferry.state.epoch_replay import apply_epoch_rng, build_skipping, capture_epoch_rng
from ferry.state.loader import iterate_untracked

log = logging.getLogger("ferry")


class Position:
    """Where the training loader's current iterator is: see the module docstring."""

    def __init__(self, loader: DataLoader[Any], made: dict[str, Any]) -> None:
        self.loader = loader
        self.made = made
        self.first: dict[str, Any] | None = None
        self.count = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "made": self.made,
            "first": self.first,
            "count": self.count,
            "now": capture_epoch_rng(self.loader),
        }


class Batches:
    """The iterator ``fit`` draws training batches from: the loader's, counted."""

    def __init__(self, real: Iterator[Any], position: Position) -> None:
        self.real, self.position = real, position

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> Any:
        pos = self.position
        if pos.first is None:
            pos.first = capture_epoch_rng(pos.loader)
        batch = next(self.real)
        pos.count += 1
        return batch

    def __len__(self) -> int:
        return len(self.real)  # type: ignore[arg-type]


def _iterate(loader: DataLoader[Any]) -> Iterator[Any]:
    """``iter(loader)`` while ``build_skipping`` has put its skipping sampler in place. A
    persistent worker pool (made when Keras first looked at a batch, before the restore)
    keeps the sampler it was made with; it is shown the skipping one for this ``iter()``."""
    pool = getattr(loader, "_iterator", None) if loader.persistent_workers else None
    if pool is None:
        return iterate_untracked(loader)
    kept = pool._index_sampler
    pool._index_sampler = loader._index_sampler
    try:
        return iterate_untracked(loader)
    finally:
        pool._index_sampler = kept


def fresh(loader: DataLoader[Any]) -> Batches:
    """The training batches of a new iterator of ``loader``, counted from here."""
    position = Position(loader, capture_epoch_rng(loader))
    return Batches(iterate_untracked(loader), position)


def replay(loader: DataLoader[Any], saved: dict[str, Any]) -> Batches:
    """The iterator the checkpoint's was, at the checkpoint's batch (module docstring)."""
    position = Position(loader, saved["made"])
    position.first, position.count = saved["first"], int(saved["count"])
    count, first = position.count, position.first
    apply_epoch_rng(loader, position.made)
    if count and first is not None and not isinstance(loader.dataset, IterableDataset):
        # Without workers the sampler starts at the first batch; with them, in iter().
        rewind = (lambda: apply_epoch_rng(loader, first)) if loader.num_workers == 0 else None
        it = build_skipping(loader, count, lambda: _iterate(loader), rewind)
    else:
        it = iterate_untracked(loader)
        if count and first is not None:
            log.info(
                "ferry: keras: the training data has no sampler to skip at (an iterable "
                "dataset, as a PyDataset's): resuming reads and drops %d batches",
                count,
            )
            apply_epoch_rng(loader, first)
            for _ in range(count):
                next(it)
    apply_epoch_rng(loader, saved["now"])
    return Batches(it, position)
