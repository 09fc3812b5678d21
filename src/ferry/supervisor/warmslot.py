"""The supervisor's warm worker, while there is one: the requests that ask for it, its answer,
its end when it cannot take over, whether it may take over now, its release (after a
migration's checkpoint, after the old worker's exit, or when a ``ferry resume --warm`` gate
has the state in place), and the old worker it took over from, while that one exits.

The records of a take-over (the job's worker, the in-place restart it counts as) are the
running job's (``running``). docs/jobs.md, "Warm migration", has the protocol.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from ferry.knobs import PROCESS_POLL_SECONDS
from ferry.runtime.jobdir import JobDir
from ferry.supervisor import warm
from ferry.supervisor.decide import hand_over_now
from ferry.supervisor.signals import SignalPump
from ferry.supervisor.stopping import signal_name
from ferry.supervisor.warm import WarmGate, WarmRequest, WarmWorker
from ferry.supervisor.worker import WorkerGroup

log = logging.getLogger("ferry.run")

Start = Callable[[WarmRequest], WarmWorker]
"""Starts the warm worker a request asks for (OSError when it cannot be)."""


class WarmSlot:
    """At most one warm worker, the worker it took over from while that one exits, and the
    process groups of all the job's live workers."""

    def __init__(self, job: JobDir) -> None:
        self.job = job
        self.worker: WarmWorker | None = None
        self.env: dict[str, str] = {}
        """The env it was started with beyond the job's (the migration's target devices)."""
        self.answered = False
        """Its request was answered (it is ready), or there is no request to answer."""
        self.groups: set[int] = set()
        """Process groups of the job's live workers, warm ones included: shared with each
        worker as ``WorkerGroup.spare``, so that none is a stray of another's."""
        self.retiring: WorkerGroup | None = None
        """The worker a warm one took over from, while it exits."""

    @property
    def busy(self) -> bool:
        return self.worker is not None

    def adopt(self, worker: WarmWorker, env: dict[str, str], *, answered: bool) -> None:
        """``worker`` is the warm worker from now on."""
        self.worker, self.env, self.answered = worker, dict(env), answered
        self.groups.add(worker.pid)
        worker.group.spare = self.groups

    def refuse_left(self, why: str) -> None:
        """Answer every warm request left from the job's last run: none carries over."""
        for request in warm.take_requests(self.job):
            rid = request.id if isinstance(request, WarmRequest) else request[0]
            warm.answer(self.job, rid, ok=False, error=f"warm start refused: {why}")

    def tend(self, current: WorkerGroup, start: Start, stop_signal: int | None) -> None:
        """Take warm requests; answer the pending one once its worker is ready or gone; end
        a warm worker that can no longer take over."""
        for request in warm.take_requests(self.job):
            if isinstance(request, WarmRequest):
                self._start(request, current, start, stop_signal)
            else:
                warm.answer(self.job, request[0], ok=False, error=request[1])
        w = self.worker
        if w is None:
            return
        if stop_signal is not None:
            self.drop(f"the job is stopping ({signal_name(stop_signal)})")
        elif time.time() > w.expires:
            self.drop("it did not take over in time (its `ferry migrate` gave up)")
        elif not self.answered and w.poll_ready():
            self.answered = True
            seconds = _ready_seconds(self.job, w)
            warm.answer(self.job, w.rid, ok=True, pid=w.pid, seconds=seconds)
            log.info("ferry run: warm worker pid %d waits at its restore point (%.2f s)", w.pid, seconds)
        elif (code := w.exited()) is not None:
            self.drop(_gone(w, code))

    def _start(
        self, request: WarmRequest, current: WorkerGroup, start: Start, stop_signal: int | None
    ) -> None:
        refuse = None
        if self.worker is not None:
            refuse = f"a warm worker (pid {self.worker.pid}) is already waiting: one migration at a time"
        elif stop_signal is not None:
            refuse = "the job is stopping"
        else:
            try:
                self.adopt(start(request), request.env, answered=False)
            except OSError as exc:
                refuse = f"cannot start a warm worker: {exc.strerror or exc}"
        if refuse is not None or self.worker is None:
            warm.answer(self.job, request.id, ok=False, error=f"{refuse}; the job trains on unchanged")
            return
        current.spare = self.groups
        self.job.event("warm_start", pid=self.worker.pid, env=request.env)
        log.info("ferry run: warm worker pid %d starting beside worker pid %d", self.worker.pid, current.pid)

    def drop(self, why: str) -> None:
        """Discard the warm worker (it wrote nothing); a pending request is answered with ``why``."""
        w, self.worker = self.worker, None
        if w is None:
            return
        w.discard()
        self.groups.discard(w.pid)
        self.job.event("warm_discarded", pid=w.pid, reason=why)
        if not self.answered:
            warm.answer(self.job, w.rid, ok=False, error=f"{why}; the job trains on unchanged")
        log.warning("ferry run: warm worker pid %d discarded: %s", w.pid, why)

    def may_take_over(self, *, stopping: bool, restarts: int, max_restarts: int) -> bool:
        """The current worker committed its checkpoint for this warm worker's migration
        (``decide.hand_over_now``, from the job's status)."""
        if self.worker is None or not self.answered:
            return False
        status = self.job.status()
        return hand_over_now(
            state=status.get("state"),
            restart=status.get("restart"),
            updated=float(status.get("updated", 0) or 0),
            worker_started=float(status.get("worker_started", 0) or 0),
            warm_env=self.env,
            warm_ready=True,
            stopping=stopping,
            restarts=restarts,
            max_restarts=max_restarts,
        )

    def release(self, why_not: str) -> WarmWorker | None:
        """Let the warm worker take over; None (it is discarded, saying ``why_not``) when it
        cannot: it is gone, or not waiting at its restore point."""
        w = self.worker
        if w is None:
            return None
        if not self.answered or not w.go():
            self.drop(why_not)
            return None
        self.worker = None
        return w

    def after_exit(self, reason: Mapping[str, object] | None) -> WarmWorker | None:
        """The warm worker, released to take over after the old worker exited for the restart
        ``reason`` (the old worker exited before its commit was noticed); None (the warm one,
        if any, is discarded): start the worker cold."""
        if self.worker is None:
            return None
        if (reason or {}).get("reason") != "requested" or (reason or {}).get("env") != self.env:
            self.drop("the worker restarted for another reason than the migration")
            return None
        return self.release("it was not waiting at its restore point; starting the worker cold")

    def await_gate(self, w: WarmWorker, gate: WarmGate, pump: SignalPump) -> WarmWorker | str:
        """``w``, the job's first worker started warm, released once ``gate`` has the state in
        place; why not (``w`` discarded) when the run ends before that."""
        self.adopt(w, {}, answered=True)  # nobody waits for an answer
        self.job.event("warm_start", pid=w.pid, env={})
        ready = False
        while True:
            pump.forward(None)
            failed = None
            if pump.stop_signal is not None:
                failed = f"stopped by {signal_name(pump.stop_signal)} before the state arrived"
            elif (code := w.exited()) is not None:
                failed = _gone(w, code) + " before it took over"
            elif not ready and w.poll_ready():
                ready = True
                gate.ready(w.pid, _ready_seconds(self.job, w))
            elif ready and (failed := gate.poll()) == "":
                failed = f"the warm worker (pid {w.pid}) was gone when the state arrived"
                if self.release(failed):
                    return w
            if failed is not None:
                self.drop(failed)
                return failed
            pump.wait(PROCESS_POLL_SECONDS)

    def reap_retiring(
        self, *, current: WorkerGroup | None, grace: float, exit_code: int, wait: bool = False
    ) -> None:
        """Record the exit of the worker a warm one took over from (``wait``: it must end now,
        within ``grace``: the worker after it, ``current``, ended already)."""
        old = self.retiring
        if old is None:
            return
        if wait:
            old.abandon(grace, quiet=True)
        returncode = old.poll()
        if returncode is None:
            return
        self.retiring = None
        old.clear()
        self.groups.discard(old.pid)
        self.job.event(
            "worker_exit",
            pid=old.pid,
            returncode=returncode,
            signal=signal_name(-returncode) if returncode < 0 else None,
        )
        if returncode not in (0, exit_code):
            log.warning(
                "ferry run: worker pid %d exited with %d after it handed its state over: the job "
                "goes on with worker pid %s",
                old.pid,
                returncode,
                current.pid if current is not None else "?",
            )


def _ready_seconds(job: JobDir, w: WarmWorker) -> float:
    """Record that ``w`` is ready; returns its start-up's seconds."""
    seconds = (w.ready_at or w.started) - w.started
    job.event("warm_ready", pid=w.pid, seconds=seconds)
    return seconds


def _gone(w: WarmWorker, code: int) -> str:
    """Why the warm worker ``w``, which exited with the Popen return code ``code``, is gone."""
    words = w.last_words()
    why = f"exited with {code}" if code >= 0 else f"was killed by {signal_name(-code)}"
    return f"the warm worker (pid {w.pid}) {why}" + (f": {words}" if words else "")
