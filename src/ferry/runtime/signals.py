"""Signal handlers that only record the request; the work happens at the next safe point.

Handlers that were installed before are chained to and put back on ``uninstall``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class SignalRequests:
    """Records "stop" and "checkpoint" requests from signals, in a handler-safe way."""

    def __init__(self, stop: tuple[str, ...], checkpoint: tuple[str, ...]) -> None:
        self._actions = {getattr(signal, n): "stop" for n in stop}
        self._actions.update({getattr(signal, n): "checkpoint" for n in checkpoint})
        self._previous: dict[int, Handler] = {}
        self.stop_signal: int | None = None
        self.checkpoint_requested = False
        self.count = 0

    def install(self) -> bool:
        """Install the handlers; only possible from the main thread (returns False elsewhere)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in self._actions:
            self._previous[signum] = signal.signal(signum, self._handle)
        return True

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self._actions.get(signum) == "stop":
            if self.stop_signal is None:
                self.stop_signal = signum
        else:
            self.checkpoint_requested = True
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)

    @property
    def signals(self) -> list[int]:
        return list(self._actions)


def ignore_in_worker(signums: list[int]) -> None:
    """In a DataLoader worker: the main process decides when to stop, not the signal."""
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)
