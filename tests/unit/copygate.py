"""A gate for the copies a snapshot defers (``overlap_snapshot``)."""

from __future__ import annotations

import threading
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

    def open(self) -> None:
        self.event.set()

    def close(self) -> None:
        self.event.clear()

    def _copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        assert self.event.wait(30)
        if self.error is not None:
            raise self.error
        np.copyto(dst, src)

    def start(self, pieces: list[tuple[np.ndarray, np.ndarray]]) -> list[Future[None]]:
        self.pieces += len(pieces)
        pool = snapshot_module._pool()
        return [pool.submit(self._copy, d, s) for d, s in pieces]
