"""Signal handlers that only record the request; the work happens at the next safe point.

Handlers that were installed before are chained to (``chains``) and put back on ``uninstall``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def chains(previous: Handler, *, stop: bool, at_safe_points: bool) -> bool:
    """Whether the handler that was there before ferry's runs after ferry recorded a signal.

    ``SIG_DFL`` and ``SIG_IGN`` never run: ferry's handler replaces the default action. Nor
    does Python's own SIGINT handler (``KeyboardInterrupt``) for a stop signal once the script
    reaches safe points: raised mid-step it would end the run with no checkpoint, and a
    second Ctrl-C would abort the stop's save. Before the first safe point there is nothing
    to checkpoint yet, and a script that never reaches one (not in the usual idiom) must stay
    interruptible, so until then Ctrl-C interrupts as it would without ferry. Any other
    Python handler (a framework's) runs."""
    if not callable(previous):
        return False
    if stop and previous is signal.default_int_handler:
        return not at_safe_points
    return True


def chains_after(*, stop: bool, at_safe_points: bool) -> bool:
    """Whether a handler installed after ferry's (a framework's, the script's), over which
    ferry put its own back (``reassert``), runs after ferry recorded a signal. Not for a stop
    once the script reaches safe points: such a handler may end the run at its own point
    (Lightning's ends the fit loop at the batch's end), before ferry's safe point, with no
    checkpoint. ferry's stop ends the process itself, with a checkpoint and its exit code."""
    return not (stop and at_safe_points)


class SignalRequests:
    """Records "stop" and "checkpoint" requests from signals, in a handler-safe way."""

    def __init__(self, stop: tuple[str, ...], checkpoint: tuple[str, ...]) -> None:
        self._actions = {getattr(signal, n): "stop" for n in stop}
        self._actions.update({getattr(signal, n): "checkpoint" for n in checkpoint})
        self._previous: dict[int, Handler] = {}
        self._after: dict[int, Handler] = {}
        """Handlers installed over ferry's later, which ferry put its own back over."""
        self._inside = False
        self.stop_signal: int | None = None
        self.checkpoint_requested = False
        self.count = 0
        self.stop_count = 0
        """Stop signals received: the first asks for the stop, the others change nothing."""
        self.at_safe_points = False
        """Set by the session at its first safe point: from then on a stop signal only
        records (see ``chains``)."""

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
                later = self._after.get(signum)
                back = later if later is not None else previous
                signal.signal(signum, back if back is not None else signal.SIG_DFL)
        self._previous.clear()
        self._after.clear()

    def reassert(self) -> list[tuple[int, Handler]]:
        """Put ferry's handler back over any installed since (called at safe points, on the
        main thread); returns (signal, handler) for each one found, which from now on runs
        after ferry's (``chains_after``)."""
        if not self._previous or threading.current_thread() is not threading.main_thread():
            return []
        found: list[tuple[int, Handler]] = []
        for signum in self._previous:
            current: Handler = signal.getsignal(signum)
            if current == self._handle or current is None:  # None: installed outside Python
                continue
            self._after[signum] = current
            signal.signal(signum, self._handle)
            found.append((signum, current))
        return found

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._inside:  # a later handler calling its own "previous" (ferry's) back
            return
        self._inside = True
        try:
            self._record(signum, frame)
        finally:
            self._inside = False

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        stop = self._actions.get(signum) == "stop"
        if stop:
            self.stop_count += 1
            if self.stop_signal is None:
                self.stop_signal = signum
        else:
            self.checkpoint_requested = True
        previous = self._previous.get(signum)
        if callable(previous) and chains(previous, stop=stop, at_safe_points=self.at_safe_points):
            previous(signum, frame)
        later = self._after.get(signum)
        if callable(later) and chains_after(stop=stop, at_safe_points=self.at_safe_points):
            later(signum, frame)

    @property
    def signals(self) -> list[int]:
        return list(self._actions)


def ignore_in_worker(signums: list[int]) -> None:
    """In a DataLoader worker: the main process decides when to stop, not the signal."""
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)
