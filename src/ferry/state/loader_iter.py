"""The iterators a tracked DataLoader hands out (``state/loader.py``): ``TrackedIter``, whose
every batch request is a safe point, and ``FastForward``, for an epoch the checkpoint
already covers, met before the restore point."""

from __future__ import annotations

import dis
import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader

from ferry.state import worker_rng
from ferry.state.usercode import is_user_file

if TYPE_CHECKING:
    from ferry.state.loader import LoaderTracker


@functools.cache
def _users_generator(code: CodeType) -> bool:
    """Is ``code`` a generator of the user's code? One asking for batches wraps the loader
    (a prefetcher, a transform per batch), and its frame, with what it holds, is captured."""
    return bool(code.co_flags & inspect.CO_GENERATOR) and is_user_file(code.co_filename)


def _in_for_loop(frame: FrameType | None) -> bool:
    """Is ``frame`` (the code asking for a batch) a ``for`` statement, rather than a call
    to ``next()``? Both idioms must fast-forward, in different ways."""
    if frame is None:
        return True
    code = frame.f_code.co_code
    return 0 <= frame.f_lasti < len(code) and dis.opname[code[frame.f_lasti]] == "FOR_ITER"


class FastForward:
    """An epoch the checkpoint already covers, met before the restore point.

    In an epoch loop (``for batch in loader``) it is empty: the epoch is skipped without
    loading anything, and the script's loop reaches the saved epoch by itself. In a
    step loop (``next(it)``, re-``iter()`` on StopIteration) an empty epoch would end the
    loop, so it jumps straight to the saved position instead."""

    def __init__(
        self,
        tracker: LoaderTracker,
        loader: DataLoader[Any],
        make: Callable[[], Iterator[Any]],
        target: dict[str, Any],
    ) -> None:
        self.tracker, self.loader, self.make, self.target = tracker, loader, make, target
        self._real: Iterator[Any] | None = None

    def __iter__(self) -> FastForward:
        return self

    def __next__(self) -> Any:
        if self._real is None:
            if _in_for_loop(sys._getframe(1)):
                raise StopIteration
            self.tracker.epoch = int(self.target["epoch"])
            self._real = self.tracker.resume_epoch(self.loader, self.make, self.target)
        return next(self._real)

    def __len__(self) -> int:
        return len(self.loader)


class TrackedIter:
    """The iterator a tracked loader hands out: each request for a batch is a safe point."""

    def __init__(
        self, tracker: LoaderTracker, real: Iterator[Any], restore_point: bool = False, kept: int = 0
    ) -> None:
        self.tracker = tracker
        self.real = real
        self._restore_point = restore_point
        self._kept = kept
        """Batches the restored frames hold (a wrapping generator's, handed out before the
        checkpoint): announced as taken at the restore point, as the stopped run took them."""

    def __iter__(self) -> TrackedIter:
        return self

    def __len__(self) -> int:
        return len(self.real)  # type: ignore[arg-type]

    def __next__(self) -> Any:
        hooks = self.tracker.hooks
        caller = sys._getframe(1)
        if self.tracker.batches == 0 and self.tracker.feeding.site is None:
            self.tracker.feeding.site = (caller.f_code.co_filename, caller.f_lineno)
        self.tracker.asked_by_generator = _users_generator(caller.f_code)
        if self._restore_point:
            self._restore_point = False
            hooks.at_restore_point(self.tracker)
            for _ in range(self._kept):
                hooks.after_batch(self.tracker)
        hooks.before_batch(self.tracker)
        batch = next(self.real)
        while worker_rng.is_blank(batch):  # only first, in an epoch resumed with workers
            batch = next(self.real)
        batch = worker_rng.unwrap(batch, self.tracker.worker_rng)
        self.tracker.batches += 1
        hooks.after_batch(self.tracker)
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)
