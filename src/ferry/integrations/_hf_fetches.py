"""The random streams each prefetched batch of the Trainer's DataLoader was drawn with.

At the safe point (``on_step_begin``) the Trainer holds the batches of the step it is about
to train, and accelerate's ``DataLoaderShard`` one more: fetched before the checkpoint,
trained after it. A collator or dataset that draws random numbers in the main process
(an MLM collator's masking, a random crop with ``num_workers=0``) drew them from the global
streams as they were before each of those fetches. The resumed run fetches those batches
again (the Trainer's own skip starts at the first untrained one); for each, the streams are
first set back to what they were before the original fetch, so the batches come out the
same, and the random streams the training then continues with are the checkpoint's.
The streams as the epoch's sampler began are replayed too: a sampler that draws its order
from them (``LengthGroupedSampler``, for ``train_sampling_strategy="group_by_length"``, or
a plain ``RandomSampler``) draws the interrupted epoch's order again.

How: the DataLoader's batch sampler is replaced, in place, by ``Fetches``, which yields
the same index lists and notes the streams just before each (the DataLoader fetches that
batch right after taking its indices). Only for ``num_workers=0``: with workers, indices
are taken ahead of time and the batches drawn in the workers.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from ferry.state.rng import GlobalRNG

SAMPLER = -1
"""The index under which the streams as the epoch's sampler began are kept."""


class FetchLog:
    """The streams as the current epoch's sampler began and before its last few fetches,
    and those to replay, by batch index in the epoch (``SAMPLER`` for the sampler's start)."""

    def __init__(self) -> None:
        self.recent: collections.deque[tuple[int, dict[str, Any]]] = collections.deque(maxlen=2)
        self.start: dict[str, Any] | None = None
        self.replay: dict[int, dict[str, Any]] = {}
        self._next: dict[int, dict[str, Any]] = {}

    def keep(self, fetches: int) -> None:
        """Keep the streams of the last ``fetches`` fetches (those a safe point may follow)."""
        self.recent = collections.deque(self.recent, maxlen=max(fetches, 1))

    def pending(self) -> dict[int, dict[str, Any]]:
        pending = dict(self.recent)
        if self.start is not None:
            pending[SAMPLER] = self.start
        return pending

    def replay_next_epoch(self, fetches: dict[int, dict[str, Any]]) -> None:
        """Draw these batches (by index in the epoch) of the next epoch begun from these streams."""
        self._next = dict(fetches)

    def epoch_begins(self) -> None:
        self.recent.clear()
        self.replay, self._next = self._next, {}
        start = self.replay.pop(SAMPLER, None)
        if start is not None:
            GlobalRNG().load_state_dict(start)
        self.start = GlobalRNG().state_dict()

    def before_fetch(self, index: int) -> None:
        rng = self.replay.pop(index, None)
        if rng is not None:
            GlobalRNG().load_state_dict(rng)
        self.recent.append((index, GlobalRNG().state_dict()))


class Fetches:
    """Stands in for a DataLoader's batch sampler: the same index lists, each noted in the
    log before the DataLoader fetches it (see the module docstring)."""

    def __init__(self, inner: Any, log: FetchLog) -> None:
        self.inner, self.log = inner, log

    def __iter__(self) -> Iterator[Any]:
        # A generator: nothing happens until the DataLoader asks for its first batch.
        self.log.epoch_begins()
        for index, indices in enumerate(self.inner):
            self.log.before_fetch(index)
            yield indices

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "log"):  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def attach(loader: Any, log: FetchLog) -> bool:
    """Note the fetches of ``loader`` (a DataLoader) in ``log``; False where that is not needed
    or possible (workers, no batch sampler, not a DataLoader). Idempotent."""
    if not isinstance(loader, DataLoader) or loader.num_workers > 0 or loader.batch_sampler is None:
        return False
    if not isinstance(loader.batch_sampler, Fetches):
        # DataLoader forbids setting batch_sampler after __init__; what it iterates is the same
        object.__setattr__(loader, "batch_sampler", Fetches(loader.batch_sampler, log))
    return True
