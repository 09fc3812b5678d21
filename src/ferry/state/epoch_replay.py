"""Replaying an interrupted epoch: the random state that decided its order and its workers'
seeds, taken before ``iter()`` and put back, and the batches already consumed skipped at
the sampler, whose indices are drawn but whose samples are never loaded. Used by the
loader tracker (``loader``).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from ferry.errors import bug
from ferry.state.rng import own, set_generator_state

_END = object()


def loader_generators(loader: DataLoader[Any]) -> dict[str, torch.Generator]:
    """Every torch.Generator the loader's sampling draws from, by role."""
    found: dict[str, torch.Generator] = {}
    candidates = {
        "loader": loader.generator,
        "sampler": getattr(loader.sampler, "generator", None),
        "batch_sampler": getattr(getattr(loader.batch_sampler, "sampler", None), "generator", None),
    }
    seen: set[int] = set()
    for role, gen in candidates.items():
        if isinstance(gen, torch.Generator) and id(gen) not in seen:
            seen.add(id(gen))
            found[role] = gen
    return found


def capture_epoch_rng(loader: DataLoader[Any]) -> dict[str, Any]:
    """The random state that decides an epoch's order and worker seeds, taken before iter()."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generators": {role: g.get_state() for role, g in loader_generators(loader).items()},
    }


def apply_epoch_rng(loader: DataLoader[Any], state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(own(state["torch"]))
    for role, gen in loader_generators(loader).items():
        set_generator_state(gen, state["generators"].get(role))


class _SkipIter:
    """The sampler's iterator, started eagerly, with its first ``skip`` items dropped and
    ``blank`` empty batches in front (state/worker_rng.py)."""

    def __init__(
        self, sampler: Any, skip: int, rewind: Callable[[], None] | None = None, blank: int = 0
    ) -> None:
        self._sampler, self._skip, self._rewind, self._blank = sampler, skip, rewind, blank
        self._it: Iterator[Any] | None = None
        self._head: Any = _END

    def prime(self) -> None:
        """Start the sampler now (it draws its seed here, as in the interrupted run). With
        nothing to skip, the first batch is pulled to make it draw; after a skip it already
        has, and pulling more could exhaust it (and make it draw again) too early."""
        if self._it is None:
            if self._rewind is not None:
                rewind, self._rewind = self._rewind, None
                rewind()
            self._it = iter(self._sampler)
            if self._skip:
                next(itertools.islice(self._it, self._skip - 1, self._skip), None)
            else:
                self._head = next(self._it, _END)

    def __iter__(self) -> _SkipIter:
        return self

    def __next__(self) -> Any:
        self.prime()
        if self._it is None:
            raise bug("a loader skip without an iterator")
        if self._blank:
            self._blank -= 1
            return []
        if self._head is not _END:
            head, self._head = self._head, _END
            return head
        return next(self._it)


class _SkipSampler:
    """Stands in for the loader's index sampler while the resumed epoch's iterator is built.
    One-shot: a persistent-workers iterator keeps it and later epochs iterate normally."""

    def __init__(
        self, inner: Any, skip: int, rewind: Callable[[], None] | None = None, blank: int = 0
    ) -> None:
        self.inner, self.skip, self.rewind, self.blank = inner, skip, rewind, blank
        self.started: _SkipIter | None = None

    def __iter__(self) -> Iterator[Any]:
        # A multi-worker iterator calls iter() twice while it is built: both get the same
        # skipping iterator. Once that one has started, later epochs iterate normally.
        if self.started is None:
            self.started = _SkipIter(self.inner, self.skip, self.rewind, self.blank)
            self.rewind = None  # one-shot, and kept alive by a persistent iterator
            return self.started
        if self.started._it is None:
            return self.started
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def build_skipping(
    loader: DataLoader[Any],
    skip: int,
    make: Callable[[], Iterator[Any]],
    rewind: Callable[[], None] | None = None,
    blank: int = 0,
) -> Iterator[Any]:
    """The iterator ``make()`` builds for ``loader``, with the sampler's first ``skip`` items
    drawn but never loaded, ``blank`` empty batches in front, and ``rewind`` (the epoch's
    RNG put back) run just before the sampler starts."""
    attr = "batch_sampler" if loader.batch_sampler is not None else "sampler"
    inner = getattr(loader, attr)
    wrapper = _SkipSampler(inner, skip, rewind, blank)
    object.__setattr__(loader, attr, wrapper)  # DataLoader forbids this after init; undone below
    try:
        it = make()
    finally:
        object.__setattr__(loader, attr, inner)
    if wrapper.started is not None:
        wrapper.started.prime()
    return it
