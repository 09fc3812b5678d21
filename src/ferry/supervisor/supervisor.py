"""``ferry run``: the supervisor that starts a training command as its worker and outlives it.

The supervisor owns the job directory (``job.json``, ``status.json``, the ``lock`` it holds
for its whole life, shared with its worker) and the lock of a local checkpoint root
(``rootlock``), starts the worker in a process group of its own (``worker``), forwards
every signal it receives to that whole group and escalates a stop to SIGKILL when the
worker overstays the grace period (``signals``), and acts on the worker's exit as
``decide`` says. This module is the I/O around those: the loop, the job directory's
records, the logs.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shlex
import time
from collections.abc import Sequence
from typing import Any

from ferry.config import Config
from ferry.errors import ConfigError, JobError, bug
from ferry.knobs import LEFTOVER_SECONDS, POLL_SECONDS, PROCESS_POLL_SECONDS
from ferry.runtime import handoff
from ferry.runtime.atomicjson import write_json_atomic
from ferry.runtime.control import answer_left
from ferry.runtime.finished import start_over, verdict, write_finished
from ferry.runtime.identity import choose_identity
from ferry.runtime.jobdir import JobDir
from ferry.runtime.jobfiles import Identity
from ferry.runtime.launch import nodes_of
from ferry.runtime.rootlock import RootLock
from ferry.runtime.warmstart import parent_death_signal
from ferry.schedulers import detect as detect_scheduler
from ferry.supervisor.decide import Decision, WorkerExit, decide
from ferry.supervisor.nodes import claim_job_dir, claim_root
from ferry.supervisor.options import RunOptions, check_command
from ferry.supervisor.signals import SignalPump
from ferry.supervisor.stopping import signal_name
from ferry.supervisor.warm import WarmGate, WarmRequest, WarmWorker
from ferry.supervisor.warmslot import WarmSlot
from ferry.supervisor.worker import WorkerGroup, handoff_dir, user_env, worker_env

log = logging.getLogger("ferry.run")


class Supervisor:
    """Runs one job's worker to its end; ``run()`` returns the exit status for the shell."""

    def __init__(
        self, command: Sequence[str], options: RunOptions | None = None, *, gate: WarmGate | None = None
    ) -> None:
        """``gate``: the first worker starts warm and waits at its restore point for what the
        gate waits for (``ferry resume --warm``)."""
        self.command = list(command)
        self.options = options or RunOptions()
        self.gate = gate
        # The batch system running us (docs/schedulers.md) names the job, so that its restarts
        # resume it, and may dictate the checkpoint exit code (HTCondor's job ad).
        self.scheduler = detect_scheduler()
        code = self.scheduler.exit_code(self.options.exit_code)
        if code != self.options.exit_code:
            self.options = dataclasses.replace(self.options, exit_code=code)
        # A job on many nodes (one ferry run per node) is one job: each node names it alike.
        self.nodes = nodes_of(self.command, {**os.environ, **self.options.env})
        self.node: str | None = None
        """This node's name among the job's (a job on many nodes), once its directory is claimed."""
        self.identity = choose_identity(
            given=self.options.job_id,
            scheduler=self.scheduler.name,
            scheduler_id=self.scheduler.job_id(),
            command=self.command,
            cwd=os.getcwd(),
            rendezvous=self.nodes.rendezvous if self.nodes.many else None,
        )
        self.job_id = self.identity.id
        ckpt = self.options.dir or os.path.join("ferry-checkpoints", self.job_id)
        self.checkpoint_dir = ckpt if "://" in ckpt else os.path.abspath(ckpt)
        self.job: JobDir | None = None
        self.root_lock: RootLock | None = None
        self.worker: WorkerGroup | None = None
        self.pump: SignalPump | None = None
        self.restarts = 0
        self.failures = 0
        self._restart_env: dict[str, str | None] = {}
        self._restart_reason: dict[str, Any] | None = None
        self._down_since = 0.0
        self.warm: WarmSlot | None = None
        """The warm worker of a migration, if any (made with the job directory)."""
        self._retiring: WorkerGroup | None = None
        """The worker a warm one took over from, while it exits."""

    # ------------------------------------------------------------------ public
    def run(self) -> int:
        """Supervise until the job finished, checkpointed or failed; returns the exit status."""
        check_command(self.command, self.options.env.get("PATH", os.environ.get("PATH")))
        # The worker's FERRY_* settings: a bad one would otherwise surface in the worker, which
        # would then train unprotected or fail at its first batch.
        Config.from_env({**self._user_env(), "FERRY_DIR": self.checkpoint_dir})
        # ferry resume starts a job again on purpose (and clears the record of its root)
        again = self.options.fresh or self.options.resume_command is not None
        finished = None if again else verdict(self.checkpoint_dir, self.command)
        if finished is not None:
            (log.info if finished.done else log.warning)("%s", finished.line)
            if finished.done:  # this command finished there: nothing to train
                return 0
        self.job, self.node = claim_job_dir(self.job_id, self.nodes)
        try:
            self.root_lock = claim_root(
                self.checkpoint_dir, self.job_id, self.nodes, self.node, self.job.path
            )
        except BaseException:
            self.job.release_lock()
            raise
        self.pump = SignalPump(self.options.stop_signals, self.options.grace_seconds, self.job)
        self.warm = WarmSlot(self.job)
        try:
            self._begin()
            with self.pump.installed():
                first = self._start() if self.gate is None else self._start_gated()
                if isinstance(first, int):
                    return first
                worker = first
                while True:
                    returncode = self._watch(worker)
                    if returncode is None:  # it handed over to the warm worker and is exiting
                        worker = self._take_over(worker)
                        continue
                    self._reap_retiring(wait=True)
                    worker.clear()
                    self.warm.groups.discard(worker.pid)
                    code = self._after_exit(worker, returncode)
                    if code is not None:
                        return code
                    worker = self._start()
        finally:
            self.warm.drop("the supervisor is exiting")
            self._answer_left()
            if self._retiring is not None:
                self._retiring.abandon(self.options.grace_seconds or LEFTOVER_SECONDS)
            if self.worker is not None:
                self.worker.abandon(self.options.grace_seconds or LEFTOVER_SECONDS)
            if self.root_lock is not None:
                self.root_lock.release()
            self.job.release_lock()

    def _answer_left(self) -> None:
        """The job ends: requests that came while it stopped are answered, none carries over."""
        if self.job is not None:
            try:
                answer_left(self.job, None)
            except OSError as exc:  # the next run answers them
                log.warning("ferry run: cannot answer the requests left in %s: %s", self.job.control, exc)

    # ------------------------------------------------------------------ the worker
    def _user_env(self) -> dict[str, str]:
        return user_env(os.environ, self.options, self._restart_env)

    @property
    def _handoff_dir(self) -> str:
        if self.job is None:
            raise bug("the supervisor has no job directory")
        return handoff_dir(self.job.path)

    def _begin(self) -> None:
        if self.job is None or self.warm is None:
            raise bug("the supervisor's state is incomplete here (self.job, self.warm)")
        # Requests that came while the job's last run stopped were for that run, not this one.
        answer_left(self.job, "the job stopped before it took this request; ask again now")
        self.warm.refuse_left("the job stopped before it took this request; ask again now")
        if self.options.fresh:
            log.info("%s", start_over(self.checkpoint_dir))
        try:
            import pwd

            user = pwd.getpwuid(os.getuid()).pw_name
        except (ImportError, KeyError):
            user = str(os.getuid())
        identity = Identity(
            id=self.job_id,
            command=self.command,
            cwd=os.getcwd(),
            user=user,
            supervisor_pid=os.getpid(),
            worker_pid=None,
            checkpoint_dir=self.checkpoint_dir,
            scheduler=self.scheduler.name,
            scheduler_restarts=self.scheduler.restart_count(),
        )
        if self.node is not None:
            identity["node"], identity["nodes"] = self.node, self.nodes.count
        self.job.write_identity(**identity)
        # A new run: what the previous one concluded no longer holds (checkpoints stay listed).
        self.job.update_status(
            "starting",
            supervisor_pid=os.getpid(),
            worker_pid=None,
            exit_code=None,
            error=None,
            restart=None,
            restarts=0,
            max_restarts=self.options.restarts,
            failures=0,
            started=time.time(),
        )
        self.job.event("run_start", supervisor_pid=os.getpid(), command=self.command)
        where = "" if self.node is None else f", {self.node} of {self.nodes.count} nodes"
        log.info("ferry run: job %s%s (%s)", self.job_id, where, self.identity.why)
        log.info(
            "ferry run: checkpoints under %s (%s); job directory %s",
            self.checkpoint_dir,
            "--dir" if self.options.dir else "the default: ./ferry-checkpoints/JOB",
            self.job.path,
        )

    def _env(self, user: dict[str, str]) -> dict[str, str]:
        if self.job is None:
            raise bug("the supervisor's state is incomplete here (self.job)")
        return worker_env(
            user,
            self.options,
            job_id=self.job_id,
            job_dir=self.job.path,
            checkpoint_dir=self.checkpoint_dir,
            handoff_dir=self._handoff_dir if os.path.isdir("/dev/shm") else None,
        )

    def _start(self) -> WorkerGroup:
        if self.job is None or self.pump is None:
            raise bug("the supervisor's state is incomplete here (self.job, self.pump)")
        adopted = self._adopt_warm()
        if adopted is not None:
            return adopted
        env = self._env(self._user_env())
        self._mark_starting(self.job)
        try:
            worker = self.worker = WorkerGroup(
                self.command, env, locks=self._lock_fds(), pdeathsig=self._pdeathsig()
            )
        except OSError as exc:
            error = f"cannot run {self.command[0]!r}: {exc.strerror or exc}"
            self.job.update_status("failed", error=error, exit_code=ConfigError.exit_code)
            self.job.event("run_end", state="failed", exit_code=ConfigError.exit_code, message=error)
            raise ConfigError(f"{error}; check the command after --") from None
        self._started(worker, warm=False)
        log.info("ferry run: worker pid %d started: %s", worker.pid, shlex.join(self.command))
        return worker

    def _mark_starting(self, job: JobDir) -> None:
        """The status while a worker starts (a cold one, or a warm one taking over)."""
        job.update_status(
            "starting",
            worker_pid=None,
            restarts=self.restarts,
            failures=self.failures,
            worker_started=time.time(),
        )

    def _started(self, worker: WorkerGroup, *, warm: bool) -> None:
        """``worker`` is the job's worker from now on (``warm``: a warm worker taking over)."""
        if self.job is None or self.pump is None:
            raise bug("the supervisor's state is incomplete here (self.job, self.pump)")
        if self.warm is None:
            raise bug("the supervisor's state is incomplete here (self.warm)")
        pid = worker.pid
        self.warm.groups.add(pid)
        worker.spare = self.warm.groups
        self.pump.new_worker()
        identity = self.job.identity()
        write_json_atomic(self.job.file("job.json"), {**identity, "worker_pid": pid})
        self.job.update_status("starting", worker_pid=pid)
        self.job.event("worker_start", pid=pid, restarts=self.restarts, failures=self.failures, warm=warm)
        if self._restart_reason is not None:
            downtime = time.time() - self._down_since
            self.job.event("restart", pid=pid, downtime_seconds=downtime, warm=warm, **self._restart_reason)
            self._restart_reason = None

    # ------------------------------------------------------------------ a warm worker
    def _start_warm(self, request: WarmRequest) -> WarmWorker:
        """The warm worker of a migration: the job's command, env and locks, and the request's env."""
        env = self._env(user_env(os.environ, self.options, {**self._restart_env, **request.env}))
        return WarmWorker(self.command, env, locks=self._lock_fds(), rid=request.id, expires=request.expires)

    def _adopt_warm(self) -> WorkerGroup | None:
        """The warm worker takes over after the old one exited, where it waits for this
        restart (the old worker exited before its commit was noticed); None: start one cold."""
        if self.warm is None or self.job is None:
            raise bug("the supervisor's state is incomplete here (self.warm, self.job)")
        if not self.warm.busy:
            return None
        reason = self._restart_reason or {}
        if reason.get("reason") != "requested" or reason.get("env") != self.warm.env:
            self.warm.drop("the worker restarted for another reason than the migration")
            return None
        w = self.warm.release("it was not waiting at its restore point; starting the worker cold")
        if w is None:
            return None
        self._mark_starting(self.job)
        self._started(w.group, warm=True)
        log.info("ferry run: warm worker pid %d takes over", w.pid)
        self.worker = w.group
        return w.group

    def _start_gated(self) -> WorkerGroup | int:
        """The first worker, started warm: released once the gate has the state in place;
        the exit status instead when the run ends before that."""
        if self.job is None or self.pump is None or self.gate is None or not self.warm:
            raise bug("the supervisor's state is incomplete here (self.job, self.pump, self.gate, self.warm)")
        self.job.update_status("starting", worker_pid=None, worker_started=time.time())
        try:
            w = WarmWorker(
                self.command, self._env(self._user_env()), locks=self._lock_fds(), rid="", expires=math.inf
            )
        except OSError as exc:
            error = f"cannot run {self.command[0]!r}: {exc.strerror or exc}"
            return self._end("failed", ConfigError.exit_code, f"{error}; check the command after --")
        self.warm.hold(w, {}, answered=True)  # nobody waits for an answer
        self.job.event("warm_start", pid=w.pid, env={})
        ready = False
        while True:
            self.pump.forward(None)
            failed = None
            if self.pump.stop_signal is not None:
                failed = f"stopped by {signal_name(self.pump.stop_signal)} before the state arrived"
            elif (code := w.exited()) is not None:
                failed = self.warm.gone(w, code) + " before it took over"
            elif not ready and w.poll_ready():
                ready = True
                self.gate.ready(w.pid, self.warm.ready_seconds(w))
            elif ready and (failed := self.gate.poll()) == "":
                if self.warm.release(f"the warm worker (pid {w.pid}) was gone when the state arrived"):
                    self.job.update_status("starting", worker_started=time.time())
                    self._started(w.group, warm=True)
                    self.worker = w.group
                    return w.group
                failed = f"the warm worker (pid {w.pid}) was gone when the state arrived"
            if failed is not None:
                self.warm.drop(failed)
                return self._end("failed", JobError.exit_code, f"{failed}; nothing of the job ran here")
            self.pump.wait(PROCESS_POLL_SECONDS)

    def _lock_fds(self) -> tuple[int, ...]:
        """The job's lock and its checkpoint root's: the worker holds them too, so that they
        stay held while it lives, whatever happens to the supervisor."""
        if self.job is None:
            raise bug("the supervisor has no job directory")
        fds = (self.job.lock_fd, *(() if self.root_lock is None else self.root_lock.fds))
        return tuple(fd for fd in fds if fd is not None)

    def _pdeathsig(self) -> int:
        """What the worker gets when the supervisor dies (SIGKILLed): a stop signal, so that
        it checkpoints and stops rather than trains on unsupervised."""
        return parent_death_signal(self.options.stop_signals)

    def _watch(self, worker: WorkerGroup) -> int | None:
        """Forward signals until the worker exits; returns its Popen return code, or None
        when it handed its state over to the warm worker (it is exiting)."""
        if self.pump is None or self.warm is None or self.job is None:
            raise bug("the supervisor's state is incomplete here (self.pump, self.warm, self.job)")
        while True:
            self.pump.forward(worker)
            self._reap_retiring()
            returncode = worker.poll()
            if returncode is not None:
                return returncode
            self.warm.tend(worker, self._start_warm, self.pump.stop_signal)
            stopping = self.pump.stop_signal is not None
            if self.warm.may_take_over(
                stopping=stopping, restarts=self.restarts, max_restarts=self.options.restarts
            ):
                return None
            if self.gate is not None and self.gate.settled(self.job):
                self.gate = None
            busy = self.warm.busy or self._retiring is not None
            self.pump.wait(self.pump.escalate_if_due(worker, PROCESS_POLL_SECONDS if busy else POLL_SECONDS))

    def _take_over(self, old: WorkerGroup) -> WorkerGroup:
        """The warm worker takes over from ``old``, which committed its checkpoint for the
        migration and is exiting; returns the job's worker from now on (``old`` again when
        the warm one is gone: its exit then restarts the worker cold, as decided then)."""
        if self.job is None or self.warm is None:
            raise bug("the supervisor's state is incomplete here (self.job, self.warm)")
        env, status = self.warm.env, self.job.status()
        w = self.warm.release("it was gone when the old worker handed over; the worker restarts cold")
        if w is None:
            return old
        self.restarts += 1
        self._restart_env.update(env)
        self._down_since = float(status.get("updated", time.time()))
        self._restart_reason = {"reason": "requested", "env": dict(env), "step": status.get("step")}
        self.job.update_status(
            "starting",
            restart=None,  # taken: a later exit must not reuse it
            worker_pid=None,
            restarts=self.restarts,
            failures=self.failures,
            worker_started=time.time(),
        )
        self._started(w.group, warm=True)
        self._retiring, self.worker = old, w.group
        log.info("ferry run: warm worker pid %d takes over from worker pid %d", w.pid, old.pid)
        return w.group

    def _reap_retiring(self, *, wait: bool = False) -> None:
        """Record the exit of the worker a warm one took over from (``wait``: it must end now,
        within the grace period: the worker after it ended already)."""
        old = self._retiring
        if old is None or self.job is None:
            return
        if wait:
            old.abandon(self.options.grace_seconds or LEFTOVER_SECONDS, quiet=True)
        returncode = old.poll()
        if returncode is None:
            return
        self._retiring = None
        old.clear()
        if self.warm is not None:
            self.warm.groups.discard(old.pid)
        self.job.event(
            "worker_exit",
            pid=old.pid,
            returncode=returncode,
            signal=signal_name(-returncode) if returncode < 0 else None,
        )
        if returncode not in (0, self.options.exit_code):
            log.warning(
                "ferry run: worker pid %d exited with %d after it handed its state over: the job "
                "goes on with worker pid %s",
                old.pid,
                returncode,
                self.worker.pid if self.worker is not None else "?",
            )

    # ------------------------------------------------------------------ after the worker
    def _after_exit(self, worker: WorkerGroup, returncode: int) -> int | None:
        """The supervisor's exit status, or None to start the worker again."""
        if self.job is None or self.pump is None:
            raise bug("the supervisor has no job directory or signal pump")
        self._down_since = time.time()
        self.pump.forward(worker)  # a stop signal that came with the exit decides against a restart
        self.job.event(
            "worker_exit",
            pid=worker.pid,
            returncode=returncode,
            signal=signal_name(-returncode) if returncode < 0 else None,
        )
        status = self.job.status()
        restart = status.get("restart")
        stop = self.pump.stop_signal
        started = float(status.get("worker_started", 0) or 0)
        since = float(status.get("updated", 0)) >= started  # written by this worker (or about it)
        exited = WorkerExit(
            returncode=returncode,
            checkpointed=status.get("state") == "checkpointed" and since,
            error=status.get("error") if status.get("state") == "failed" and since else None,
            stop_signal=signal_name(stop) if stop is not None else None,
            killed=self.pump.killed,
            progress=self.pump.progress,
            forwarded=frozenset(signal_name(s) for s in worker.sent),
            restart=restart if isinstance(restart, dict) else None,
            restarts=self.restarts,
            failures=self.failures,
        )
        decision = decide(exited, self.options, self.checkpoint_dir)
        for level, note in decision.notes:
            log.log(level, "%s", note)
        if decision.action != "restart" and self.warm is not None:
            self.warm.drop(f"worker pid {worker.pid} exited ({returncode}) without handing over")
        if decision.action == "restart":
            self._restart_in_place(decision)
            return None
        if decision.action == "backoff":
            self.failures += 1
            self._restart_reason = {
                "reason": "failure",
                "returncode": returncode,
                "backoff_seconds": decision.delay,
            }
            if self._sleep(decision.delay):
                return None
            return self._end("checkpointed", decision.code, decision.message)
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

    def _restart_in_place(self, decision: Decision) -> None:
        if self.job is None:
            raise bug("the supervisor has no job directory")
        self.restarts += 1
        self._restart_env.update(decision.env)
        status = self.job.status()
        self._down_since = float(status.get("updated", self._down_since))
        self.job.update_status("checkpointed", restart=None)  # taken: a later exit must not reuse it
        self._restart_reason = {"reason": "requested", "env": dict(decision.env), "step": status.get("step")}
        log.info("%s", decision.message)

    def _sleep(self, seconds: float) -> bool:
        """Wait with no worker running; False when a stop signal arrives meanwhile."""
        if self.pump is None:
            raise bug("the supervisor has no signal pump")
        deadline = time.monotonic() + seconds
        while True:
            self.pump.forward(None)
            if self.pump.stop_signal is not None:
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            self.pump.wait(left)

    def _end(self, state: str, code: int, message: str) -> int:
        if self.job is None:
            raise bug("the supervisor has no job directory")
        handoff.discard(self._handoff_dir)
        fields: dict[str, Any] = {"exit_code": code, "ended": time.time()}
        if state == "failed":
            fields["error"] = message
        self.job.update_status(state, **fields)
        stopped = self.pump is not None and self.pump.stop_signal is not None  # it ended early
        if state == "finished" and not stopped:  # a run of this job again says so, trains nothing
            warning = write_finished(
                self.checkpoint_dir, job=self.job_id, step=self.job.status().get("step"), command=self.command
            )
            if warning is not None:
                log.warning("%s", warning)
        self.job.event("run_end", state=state, exit_code=code, message=message)
        (log.info if state != "failed" else log.error)("ferry run: %s; exit %d", message, code)
        return code
