"""A live progress line for long copies (``ferry export``, ``ferry resume``, a new node
fetching its checkpoint from the remote): bytes done of the total, throughput and time
left, rewritten in place on stderr.

Drawn only where a person watches: stderr is a terminal and ``--json`` was not given
(``meter_for``); in a pipe, a log file or a wrapper's capture it stays silent, and the
one-line summary (size, seconds, throughput) is all that is printed. Pure Python, no
dependency (neither rich nor tqdm is one of ferry's), and nothing of ferry: every layer
that copies may use it.

A checkpoint save is drawn from afar: the worker's stderr is the training script's, so its
writer counts the bytes into a ``Tally`` (``counting``, ``written``), which the worker
publishes into the job's status, and a command waiting for that save draws the line.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, TextIO

Progress = Callable[[str], None]
"""A command's progress in lines (``ferry migrate``, ``export``, ``resume``): what it is
doing now, for the person who waits."""

REDRAW_SECONDS = 0.1
"""At most ten redraws a second: a copy of small pieces must not spend its time drawing."""


class Meter(Protocol):
    """Bytes moved by a long copy, for a live display. Called in this order, on the copying
    thread: ``start``, ``advance`` for each piece read, ``finish``."""

    def start(self, what: str, total: int, elapsed: float = 0.0) -> None:
        """``elapsed``: seconds the copy already ran before it was watched (its throughput
        counts from its real start)."""
        ...

    def advance(self, nbytes: int) -> None: ...

    def finish(self) -> None: ...


def amount(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


class TerminalMeter:
    """A ``Meter`` drawn as one line that rewrites itself (``\\r``, erase to end)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.what, self.total, self.done = "", 0, 0
        self._t0 = self._drawn = 0.0

    def start(self, what: str, total: int, elapsed: float = 0.0) -> None:
        self.what, self.total, self.done = what, total, 0
        now = time.monotonic()
        self._t0 = now - max(elapsed, 0.0)
        self._draw(now)

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if now - self._drawn >= REDRAW_SECONDS:
            self._draw(now)

    def finish(self) -> None:
        self._draw(time.monotonic())
        self.stream.write("\n")  # the last state stays; the summary line follows
        self.stream.flush()

    def line(self, now: float) -> str:
        seconds = max(now - self._t0, 1e-9)
        rate = self.done / seconds
        parts = [f"ferry: {self.what}: {amount(self.done)} of {amount(self.total)}"]
        if self.total:
            parts.append(f"{100 * self.done // self.total}%")
        if self.done:
            parts.append(f"{amount(rate)}/s")
            if self.done < self.total:
                left = (self.total - self.done) / rate
                parts.append(f"{left:.0f} s left" if left >= 1 else "under 1 s left")
        return ", ".join(parts)

    def _draw(self, now: float) -> None:
        self._drawn = now
        self.stream.write(f"\r{self.line(now)}\x1b[K")
        self.stream.flush()


def meter_for(as_json: bool, stream: TextIO | None = None) -> TerminalMeter | None:
    """A meter on ``stream`` (stderr) when a person is watching it; None otherwise."""
    stream = sys.stderr if stream is None else stream
    if as_json or not stream.isatty():
        return None
    return TerminalMeter(stream)


class Tally:
    """The bytes of one save in flight, counted on the thread that writes them and read on
    another (the worker's publisher): a plain counter on the writing path, and a condition
    that is told only when a save begins."""

    def __init__(self, on_begin: Callable[[int], None] | None = None) -> None:
        """``on_begin(step)``: told on the writing thread as each save begins writing."""
        self.on_begin = on_begin
        self.changed = threading.Condition()
        self.serial = 0
        """Counts the saves begun: tells one save from the next."""
        self.active = False
        self.step, self.total, self.done = 0, 0, 0
        self.started = 0.0
        """``time.time()`` at its begin: other processes read it."""

    def begin(self, step: int, total: int) -> None:
        with self.changed:
            self.step, self.total, self.done = step, total, 0
            self.started = time.time()
            self.serial += 1
            self.active = True
            self.changed.notify_all()
        if self.on_begin is not None:
            self.on_begin(step)

    def end(self) -> None:
        """Tells nobody: a watcher sees it at its next look (a save's end must cost nothing)."""
        self.active = False


_counting = threading.local()


@contextmanager
def counting(tally: Tally | None, step: int, total: int) -> Iterator[None]:
    """While the block runs, the bytes this thread writes (``written``) go to ``tally``."""
    if tally is None:
        yield
        return
    tally.begin(step, total)
    _counting.tally = tally
    try:
        yield
    finally:
        _counting.tally = None
        tally.end()


def written(nbytes: int) -> None:
    """A writer wrote ``nbytes``: counted when its thread counts for a save (``counting``)."""
    tally: Tally | None = getattr(_counting, "tally", None)
    if tally is not None:
        tally.done += nbytes
