"""The signal pump: which signals ``ferry run`` passes on, catching them (the handler only
records), forwarding them to the worker's process group from the main loop, and the
SIGKILL that ends the grace period after a stop signal."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import signal
import time
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

from ferry.errors import bug
from ferry.supervisor.forwarded import FORWARDED
from ferry.supervisor.stopping import StopProgress, grace_kill_notice, signal_name, stop_notice, stop_progress

if TYPE_CHECKING:
    from ferry.runtime.jobdir import JobDir
    from ferry.supervisor.worker import WorkerGroup

log = logging.getLogger("ferry.run")


class SignalPump:
    """Catches every forwardable signal while ``installed``; ``forward`` passes what arrived
    on to the current worker, ``escalate_if_due`` ends the grace period of a stop.

    ``stop_signal`` is the first stop signal received in the supervisor's life (it decides
    against restarts); ``killed`` says whether the current worker's stop ended in SIGKILL."""

    def __init__(self, stop_signals: tuple[str, ...], grace_seconds: float | None, job: JobDir) -> None:
        self._stop_signums = {int(getattr(signal, n)) for n in stop_signals}
        self.grace_seconds = grace_seconds
        self.job = job
        self._pending: collections.deque[int] = collections.deque()
        self._wakeup = -1
        self.stop_signal: int | None = None
        self._kill_at: float | None = None
        self.killed = False
        self._stopping = False
        """A stop signal was forwarded to the current worker: a further one is a repeat."""
        self.progress: StopProgress | None = None
        """How far the current worker's stop got when the grace period ended in SIGKILL."""

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Catch every forwardable signal (and SIGCHLD, to wake up) while supervising.

        The handlers replace, rather than chain to, the ones before: the supervisor's whole
        job is to pass signals on, and the Python defaults (KeyboardInterrupt) would kill it.
        They are put back on the way out."""
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        previous: dict[int, Any] = {}
        old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        try:
            for signum in (*FORWARDED, signal.SIGCHLD):
                with contextlib.suppress(OSError, ValueError):
                    previous[signum] = signal.signal(signum, self._record)
            self._wakeup = r
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
            signal.set_wakeup_fd(old_fd)
            os.close(r)
            os.close(w)
            self._wakeup = -1

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self._pending.append(signum)

    def wait(self, timeout: float) -> None:
        """Sleep until a signal arrives (the wakeup fd turns readable) or ``timeout``."""
        select.select([self._wakeup], [], [], max(timeout, 0.0))
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wakeup, 512):
                pass

    def new_worker(self) -> None:
        """A worker started: no grace period runs for it yet, no stop was asked of it."""
        self._kill_at, self.killed, self._stopping, self.progress = None, False, False, None

    def forward(self, worker: WorkerGroup | None) -> None:
        """Pass every signal recorded since the last call on to ``worker`` (None, or one that
        exited: they are only noted, a stop signal included)."""
        while self._pending:
            self._forward(self._pending.popleft(), worker)

    def _forward(self, signum: int, worker: WorkerGroup | None) -> None:
        if signum == signal.SIGCHLD:
            return
        name = signal_name(signum)
        stop = signum in self._stop_signums
        if stop and self.stop_signal is None:
            self.stop_signal = signum
        if worker is None or worker.returncode is not None:
            log.debug("ferry run: %s arrived with no worker running", name)
            return
        if signum == signal.SIGTSTP:
            # Terminal suspend (^Z): the worker first, then ourselves; SIGCONT is forwarded
            # on the way back. SIGSTOP, since the kernel discards SIGTSTP sent to the worker's
            # group: in a session of its own, that group counts as orphaned.
            worker.signal(signal.SIGSTOP)
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        worker.signal(signum)
        if not stop:
            log.debug("ferry run: forwarded %s to the worker's process group", name)
            return
        self.job.event("signal", signal=name, action="stop")
        grace = self.grace_seconds
        repeated = self._stopping
        self._stopping = True
        if self._kill_at is None and grace is not None:
            self._kill_at = time.monotonic() + grace
        left = None if self._kill_at is None else max(self._kill_at - time.monotonic(), 0.0)
        progress = stop_progress(self.job.status())
        notice = stop_notice(name, left, repeated=repeated, progress=progress, pid=worker.pid)
        (log.warning if repeated else log.info)("%s", notice)

    def escalate_if_due(self, worker: WorkerGroup, poll: float) -> float:
        """SIGKILL the worker's group when the grace period of a stop is over; returns how
        long the loop may sleep (at most ``poll``)."""
        if self._kill_at is None:
            return poll
        left = self._kill_at - time.monotonic()
        if left > 0:
            return min(poll, left)
        if self.stop_signal is None or self.grace_seconds is None:
            raise bug("an escalation is due with no stop signal recorded")
        name = signal_name(self.stop_signal)
        self.progress = stop_progress(self.job.status())
        log.error("%s", grace_kill_notice(name, self.grace_seconds, self.progress))
        self.job.event("grace_kill", signal=name, grace_seconds=self.grace_seconds)
        worker.signal(signal.SIGKILL)
        self._kill_at, self.killed = None, True
        return poll
