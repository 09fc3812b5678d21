"""Random augmentation in DataLoader workers, replayed exactly mid-epoch.

Each worker draws from its own Python, NumPy and torch streams (seeded by PyTorch from the
epoch's base seed) while ``Dataset.__getitem__`` crops and flips. A checkpoint taken
after batch ``b`` must let each resumed worker continue from the state it had when it
would have made its next batch. So:

- **Workers report.** The loader's ``collate_fn`` is wrapped (``TagCollate``); in a worker
  it returns the batch with the worker's id and its three RNG states *after* making it
  (``Tagged``). Nothing random happens in a worker between two batches, so that is the
  state its next batch starts from. The main process unwraps each batch as the script
  takes it (``unwrap``) and keeps, per worker, the state of its last *consumed* batch:
  batches prefetched but not yet consumed do not count, so nothing needs draining.
- **Resumed workers start from it.** PyTorch hands batch ``k`` of an epoch to worker
  ``k % n``. The resumed epoch keeps that mapping: its sampler draws the ``b`` consumed
  batches' indices and yields ``b % n`` *blank* (empty) batches first (``blanks``), which
  go to workers ``0 .. b%n-1``, make no draws, and are dropped before the script sees
  them. Each worker's start-up (``WorkerInit`` in state/loader.py) sets the saved state of
  that worker (``set_state``) after PyTorch's seeding and the script's ``worker_init_fn``.
  So worker ``w`` makes exactly the batches it made in the uninterrupted run, from the same
  states, and the script's batches are bitwise the same. With persistent workers the states
  carry over epochs, as the workers do.

Replay needs the round-robin order: map-style dataset, automatic batching (a
``batch_size``), ``in_order=True``. Other loaders keep the per-epoch worker seeds only
(``replayable`` says which).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ferry.state.rng import own

WorkerState = tuple[Any, Any, torch.Tensor]
"""A worker's Python, NumPy and torch CPU RNG states."""


def capture() -> WorkerState:
    return (random.getstate(), np.random.get_state(), torch.get_rng_state())


def set_state(state: Any) -> None:
    """Put a worker's three streams back (in the worker, at its start-up)."""
    py, np_state, torch_state = state
    random.setstate(_tuples(py))
    np.random.set_state(tuple(np_state))
    torch.set_rng_state(own(torch_state))


def _tuples(value: Any) -> Any:
    """A Python RNG state read back from a checkpoint may hold lists where it had tuples."""
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


class Blank:
    """What a worker returns for a blank batch; dropped by ``unwrap``'s caller."""

    def pin_memory(self, *args: Any) -> Blank:
        return self


class Tagged:
    """A batch from a worker, with the worker's id and RNG state after making it."""

    __slots__ = ("data", "state", "worker")

    def __init__(self, data: Any, worker: int, state: WorkerState) -> None:
        self.data, self.worker, self.state = data, worker, state

    def pin_memory(self, *args: Any) -> Tagged:  # the loader's pin_memory thread calls this
        from torch.utils.data._utils.pin_memory import pin_memory

        return Tagged(pin_memory(self.data, *args), self.worker, self.state)  # type: ignore[no-untyped-call]


class TagCollate:
    """The loader's collate_fn, reporting the worker's RNG state with each batch."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, samples: Any) -> Any:
        info = get_worker_info()
        if info is None:  # in the main process (num_workers=0 later, or a direct call)
            return self.inner(samples)
        if isinstance(samples, list) and not samples:
            return Blank()  # BatchSampler never yields an empty batch: this is ferry's blank
        return Tagged(self.inner(samples), info.id, capture())


def replayable(loader: DataLoader[Any]) -> bool:
    return (
        loader.num_workers > 0
        and loader.batch_sampler is not None
        and not isinstance(loader.dataset, IterableDataset)
        and bool(getattr(loader, "in_order", True))
    )


def tag(loader: DataLoader[Any]) -> None:
    """Make ``loader``'s workers report their RNG states (idempotent)."""
    if replayable(loader) and not isinstance(loader.collate_fn, TagCollate):
        loader.collate_fn = TagCollate(loader.collate_fn)


def unwrap(batch: Any, states: dict[str, Any]) -> Any:
    """The script's batch; a worker's state is noted in ``states`` (by worker id)."""
    if type(batch) is Tagged:
        states[str(batch.worker)] = batch.state
        return batch.data
    return batch


def is_blank(batch: Any) -> bool:
    return type(batch) is Blank


def tagged(loader: DataLoader[Any]) -> bool:
    """Do ``loader``'s workers report their states (and answer blank batches)?"""
    return replayable(loader) and isinstance(loader.collate_fn, TagCollate)


def blanks(loader: DataLoader[Any], skip: int) -> int:
    """How many blank batches keep the resumed epoch's batch-to-worker mapping."""
    return skip % loader.num_workers if tagged(loader) else 0
