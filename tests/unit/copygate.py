"""A gate for the copies a snapshot defers (``overlap_snapshot``)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import numpy as np

from ferry.engine import snapshot as snapshot_module


class CopyGate:
    """The copies a snapshot defers (``overlap_snapshot``) wait for ``open``: a copy slower
    than the training step that follows it, without a race against the clock."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.pieces = 0
        """Deferred pieces queued so far."""
        self.error: Exception | None = None
        """Raised by each copy instead of copying (a GPU lost mid-copy)."""
        self._permits = threading.Semaphore(0)
        self._copied = 0
        self._done = threading.Condition()

    def open(self) -> None:
        self.event.set()

    def close(self) -> None:
        self.event.clear()

    def allow(self, pieces: int) -> None:
        """Let the next ``pieces`` pieces through, and wait until they are copied (the pieces
        are queued in the order of the snapshot, and copied in that order)."""
        with self._done:
            want = self._copied + pieces
        for _ in range(pieces):
            self._permits.release()
        with self._done:
            assert self._done.wait_for(lambda: self._copied >= want, 30)

    def _copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        deadline = time.monotonic() + 30
        while not self.event.is_set() and not self._permits.acquire(timeout=0.005):
            assert time.monotonic() < deadline
        if self.error is not None:
            raise self.error
        np.copyto(dst, src)
        with self._done:
            self._copied += 1
            self._done.notify_all()

    def start(self, pieces: list[tuple[np.ndarray, np.ndarray]]) -> list[Future[None]]:
        self.pieces += len(pieces)
        pool = snapshot_module._pool()
        return [pool.submit(self._copy, d, s) for d, s in pieces]
