"""One run of a job under ``ferry run``, from its first worker to the supervisor's exit
status: the loop that watches the worker, acts on its exit as ``decide`` says, restarts it
in place, after a failure, or hands over to a warm one (``warmslot``), and the job
directory's records of each.

``Supervisor.run()`` claims the job directory and the checkpoint root, then builds this with
every collaborator in place: nothing here is optional, but the worker before it started.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ferry.errors import ConfigError, JobError
from ferry.knobs import LEFTOVER_SECONDS, POLL_SECONDS, PROCESS_POLL_SECONDS
from ferry.runtime import handoff
from ferry.runtime.atomicjson import write_json_atomic
from ferry.runtime.control import answer_left
from ferry.runtime.finished import write_finished
from ferry.runtime.jobdir import JobDir
from ferry.runtime.jobfiles import Status
from ferry.schedulers.base import SchedulerAdapter
from ferry.supervisor.decide import ExitDecision, WorkerExit, decide_exit
from ferry.supervisor.launcher import Launcher
from ferry.supervisor.signals import SignalPump
from ferry.supervisor.stopping import signal_name
from ferry.supervisor.warm import WarmGate
from ferry.supervisor.warmslot import WarmSlot
from ferry.supervisor.worker import WorkerGroup, handoff_dir

log = logging.getLogger("ferry.run")


@dataclass
class RestartTally:
    """The restarts of this run so far, and the one under way."""

    restarts: int = 0
    """In-place restarts done (a migration's included)."""
    failures: int = 0
    """Failures restarted from the last checkpoint."""
    reason: dict[str, Any] | None = None
    """Why the next worker starts (recorded with its start as the ``restart`` event)."""
    down_since: float = 0.0
    """When the job stopped training for the restart under way."""


class RunningJob:
    """The job's workers, one after the other, until the job finished, checkpointed or failed."""

    def __init__(
        self,
        job: JobDir,
        launch: Launcher,
        pump: SignalPump,
        slot: WarmSlot,
        scheduler: SchedulerAdapter,
        gate: WarmGate | None = None,
    ) -> None:
        """``gate``: the first worker starts warm and waits at its restore point for what the
        gate waits for (``ferry resume --warm``)."""
        self.job, self.launch, self.pump, self.slot = job, launch, pump, slot
        self.scheduler, self.gate = scheduler, gate
        self.options = launch.options
        self.grace = self.options.grace_seconds or LEFTOVER_SECONDS
        """How long a worker left behind gets to exit before SIGKILL."""
        self.tally = RestartTally()
        self.worker: WorkerGroup | None = None
        """The job's worker from its first start on."""

    def supervise(self) -> int:
        """Run workers (with the signal pump installed) until the job ends; its exit status."""
        with self.pump.installed():
            first = self._start() if self.gate is None else self._start_gated(self.gate)
            if isinstance(first, int):
                return first
            worker = first
            while True:
                returncode = self._watch(worker)
                if returncode is None:  # it handed over to the warm worker and is exiting
                    worker = self._take_over(worker)
                    continue
                self.slot.reap_retiring(
                    current=self.worker, grace=self.grace, exit_code=self.options.exit_code, wait=True
                )
                worker.clear()
                self.slot.groups.discard(worker.pid)
                code = self._after_exit(worker, returncode)
                if code is not None:
                    return code
                worker = self._start()

    def close(self) -> None:
        """The supervisor is leaving: no warm worker, no request, no worker stays behind."""
        self.slot.drop("the supervisor is exiting")
        try:
            answer_left(self.job, None)  # requests that came while the job stopped: none carries over
        except OSError as exc:  # the next run answers them
            log.warning("ferry run: cannot answer the requests left in %s: %s", self.job.control, exc)
        if self.slot.retiring is not None:
            self.slot.retiring.abandon(self.grace)
        if self.worker is not None:
            self.worker.abandon(self.grace)

    # ------------------------------------------------------------------ starting a worker
    def _start(self) -> WorkerGroup:
        warm = self.slot.after_exit(self.tally.reason)
        if warm is not None:
            self._mark_starting()
            self._started(warm.group, warm=True)
            log.info("ferry run: warm worker pid %d takes over", warm.pid)
            return warm.group
        self._mark_starting()
        try:
            worker = self.launch.cold()
        except OSError as exc:
            command = self.launch.command
            error = f"cannot run {command[0]!r}: {exc.strerror or exc}"
            self.job.update_status("failed", error=error, exit_code=ConfigError.exit_code)
            self.job.event("run_end", state="failed", exit_code=ConfigError.exit_code, message=error)
            raise ConfigError(f"{error}; check the command after --") from None
        self._started(worker, warm=False)
        log.info("ferry run: worker pid %d started: %s", worker.pid, shlex.join(self.launch.command))
        return worker

    def _start_gated(self, gate: WarmGate) -> WorkerGroup | int:
        """The first worker, started warm: released once the gate has the state in place;
        the exit status instead when the run ends before that."""
        self.job.update_status("starting", worker_pid=None, worker_started=time.time())
        try:
            w = self.launch.gated()
        except OSError as exc:
            error = f"cannot run {self.launch.command[0]!r}: {exc.strerror or exc}"
            return self._end("failed", ConfigError.exit_code, f"{error}; check the command after --")
        released = self.slot.await_gate(w, gate, self.pump)
        if isinstance(released, str):
            return self._end("failed", JobError.exit_code, f"{released}; nothing of the job ran here")
        self.job.update_status("starting", worker_started=time.time())
        self._started(released.group, warm=True)
        return released.group

    def _mark_starting(self) -> None:
        """The status while a worker starts (a cold one, or a warm one taking over)."""
        self.job.update_status(
            "starting",
            worker_pid=None,
            restarts=self.tally.restarts,
            failures=self.tally.failures,
            worker_started=time.time(),
        )

    def _started(self, worker: WorkerGroup, *, warm: bool) -> None:
        """``worker`` is the job's worker from now on (``warm``: a warm worker taking over)."""
        self.worker = worker
        pid = worker.pid
        self.slot.groups.add(pid)
        worker.spare = self.slot.groups
        self.pump.new_worker()
        write_json_atomic(self.job.file("job.json"), {**self.job.identity(), "worker_pid": pid})
        self.job.update_status("starting", worker_pid=pid)
        r = self.tally
        self.job.event("worker_start", pid=pid, restarts=r.restarts, failures=r.failures, warm=warm)
        if r.reason is not None:
            downtime = time.time() - r.down_since
            self.job.event("restart", pid=pid, downtime_seconds=downtime, warm=warm, **r.reason)
            r.reason = None

    # ------------------------------------------------------------------ while it runs
    def _watch(self, worker: WorkerGroup) -> int | None:
        """Forward signals until the worker exits; returns its Popen return code, or None
        when it handed its state over to the warm worker (it is exiting)."""
        while True:
            self.pump.forward(worker)
            self.slot.reap_retiring(current=self.worker, grace=self.grace, exit_code=self.options.exit_code)
            returncode = worker.poll()
            if returncode is not None:
                return returncode
            self.slot.tend(worker, self.launch.warm, self.pump.stop_signal)
            stopping = self.pump.stop_signal is not None
            if self.slot.may_take_over(
                stopping=stopping, restarts=self.tally.restarts, max_restarts=self.options.max_restarts
            ):
                return None
            if self.gate is not None and self.gate.settled(self.job):
                self.gate = None
            busy = self.slot.busy or self.slot.retiring is not None
            self.pump.wait(self.pump.escalate_if_due(worker, PROCESS_POLL_SECONDS if busy else POLL_SECONDS))

    def _take_over(self, old: WorkerGroup) -> WorkerGroup:
        """The warm worker takes over from ``old``, which committed its checkpoint for the
        migration and is exiting; returns the job's worker from now on (``old`` again when
        the warm one is gone: its exit then restarts the worker cold, as decided then)."""
        env, status = self.slot.env, self.job.status()
        w = self.slot.release("it was gone when the old worker handed over; the worker restarts cold")
        if w is None:
            return old
        self._count_restart(env, status, float(status.get("updated", time.time())))
        self.job.update_status(
            "starting",
            restart=None,  # taken: a later exit must not reuse it
            worker_pid=None,
            restarts=self.tally.restarts,
            failures=self.tally.failures,
            worker_started=time.time(),
        )
        self._started(w.group, warm=True)
        self.slot.retiring = old
        log.info("ferry run: warm worker pid %d takes over from worker pid %d", w.pid, old.pid)
        return w.group

    def _count_restart(self, env: Mapping[str, str | None], status: Status, down_since: float) -> None:
        """An in-place restart with ``env`` (a migration's, or a restart request's) is under way."""
        r = self.tally
        r.restarts += 1
        self.launch.restart_env.update(env)
        r.down_since = down_since
        r.reason = {"reason": "requested", "env": dict(env), "step": status.get("step")}

    # ------------------------------------------------------------------ after the worker
    def _exit_of(self, worker: WorkerGroup, returncode: int) -> WorkerExit:
        """What the job's status and the signal pump tell of the worker's exit."""
        status = self.job.status()
        restart = status.get("restart")
        stop = self.pump.stop_signal
        started = float(status.get("worker_started", 0) or 0)
        since = float(status.get("updated", 0)) >= started  # written by this worker (or about it)
        return WorkerExit(
            returncode=returncode,
            checkpointed=status.get("state") == "checkpointed" and since,
            error=status.get("error") if status.get("state") == "failed" and since else None,
            stop_signal=signal_name(stop) if stop is not None else None,
            killed=self.pump.killed,
            progress=self.pump.progress,
            forwarded=frozenset(signal_name(s) for s in worker.sent),
            restart=restart if isinstance(restart, dict) else None,
            restarts=self.tally.restarts,
            failures=self.tally.failures,
        )

    def _after_exit(self, worker: WorkerGroup, returncode: int) -> int | None:
        """The supervisor's exit status, or None to start the worker again."""
        self.tally.down_since = time.time()
        self.pump.forward(worker)  # a stop signal that came with the exit decides against a restart
        self.job.event(
            "worker_exit",
            pid=worker.pid,
            returncode=returncode,
            signal=signal_name(-returncode) if returncode < 0 else None,
        )
        decision = decide_exit(self._exit_of(worker, returncode), self.options, self.launch.checkpoint_dir)
        for level, note in decision.notes:
            log.log(level, "%s", note)
        if decision.action != "restart":
            self.slot.drop(f"worker pid {worker.pid} exited ({returncode}) without handing over")
        if decision.action == "restart":
            status = self.job.status()
            self._count_restart(decision.env, status, float(status.get("updated", self.tally.down_since)))
            self.job.update_status("checkpointed", restart=None)  # taken: a later exit must not reuse it
            log.info("%s", decision.message)
            return None
        if decision.action == "backoff":
            return self._backoff(decision, returncode)
        if not decision.hand_back:
            return self._end(decision.action, decision.code, decision.message)
        # The scheduler may take the job back (SLURM requeues it) and pick the exit status. That
        # comes last: SLURM kills the batch step soon after the requeue, so the job's end (and
        # the checkpoint the worker committed before exiting) is recorded first.
        step = self.job.status().get("step")
        self._end(decision.action, decision.code, decision.message)
        return self.scheduler.after_checkpoint(
            step=step if isinstance(step, int) else None, code=decision.code, state_dir=self.job.path
        )

    def _backoff(self, decision: ExitDecision, returncode: int) -> int | None:
        """Wait ``decision.delay`` before the restart after a failure; the exit status when a
        stop signal comes meanwhile."""
        self.tally.failures += 1
        self.tally.reason = {"reason": "failure", "returncode": returncode, "backoff_seconds": decision.delay}
        deadline = time.monotonic() + decision.delay
        while True:
            self.pump.forward(None)
            if self.pump.stop_signal is not None:
                return self._end("checkpointed", decision.code, decision.message)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.pump.wait(left)

    def _end(self, state: str, code: int, message: str) -> int:
        handoff.discard(handoff_dir(self.job.path))
        fields: dict[str, Any] = {"exit_code": code, "ended": time.time()}
        if state == "failed":
            fields["error"] = message
        self.job.update_status(state, **fields)
        stopped = self.pump.stop_signal is not None  # it ended early
        if state == "finished" and not stopped:  # a run of this job again says so, trains nothing
            launch = self.launch
            step = self.job.status().get("step")
            warning = write_finished(
                launch.checkpoint_dir, job=launch.job_id, step=step, command=launch.command
            )
            if warning is not None:
                log.warning("%s", warning)
        self.job.event("run_end", state=state, exit_code=code, message=message)
        (log.info if state != "failed" else log.error)("ferry run: %s; exit %d", message, code)
        return code
