"""``ferry run``: the supervisor that starts a training command as its worker and outlives it.

The supervisor owns the job directory (``job.json``, ``status.json``, the ``lock`` it holds
for its whole life, shared with its worker) and the lock of a local checkpoint root
(``rootlock``), starts the worker in a process group of its own (``worker``, ``launcher``),
forwards every signal it receives to that whole group and escalates a stop to SIGKILL when
the worker overstays the grace period (``signals``), and acts on the worker's exit as
``decide`` says (``running``). This module names the job, claims what it owns, writes the
job's first records and hands the run to a ``RunningJob``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence

from ferry.config import Config
from ferry.runtime.control import answer_left
from ferry.runtime.finished import start_over, verdict
from ferry.runtime.identity import choose_identity
from ferry.runtime.jobdir import JobDir
from ferry.runtime.jobfiles import Identity
from ferry.runtime.launch import nodes_of
from ferry.runtime.rootlock import RootLock
from ferry.schedulers import detect as detect_scheduler
from ferry.supervisor.launcher import Launcher
from ferry.supervisor.nodes import claim_job_dir, claim_root
from ferry.supervisor.options import RunOptions, check_command
from ferry.supervisor.running import RunningJob
from ferry.supervisor.signals import SignalPump
from ferry.supervisor.warm import WarmGate
from ferry.supervisor.warmslot import WarmSlot
from ferry.supervisor.worker import user_env

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

    def run(self) -> int:
        """Supervise until the job finished, checkpointed or failed; returns the exit status."""
        check_command(self.command, self.options.env.get("PATH", os.environ.get("PATH")))
        # The worker's FERRY_* settings: a bad one would otherwise surface in the worker, which
        # would then train unprotected or fail at its first batch.
        Config.from_env({**user_env(os.environ, self.options, {}), "FERRY_DIR": self.checkpoint_dir})
        # ferry resume starts a job again on purpose (and clears the record of its root)
        again = self.options.fresh or self.options.resume_command is not None
        finished = None if again else verdict(self.checkpoint_dir, self.command)
        if finished is not None:
            (log.info if finished.done else log.warning)("%s", finished.line)
            if finished.done:  # this command finished there: nothing to train
                return 0
        job, self.node = claim_job_dir(self.job_id, self.nodes)
        try:
            root_lock = claim_root(self.checkpoint_dir, self.job_id, self.nodes, self.node, job.path)
        except BaseException:
            job.release_lock()
            raise
        try:
            running = self._running(job, root_lock)
            try:
                self._begin(job, running.slot)
                return running.supervise()
            finally:
                running.close()
        finally:
            if root_lock is not None:
                root_lock.release()
            job.release_lock()

    def _running(self, job: JobDir, root_lock: RootLock | None) -> RunningJob:
        """The run of the job whose directory and checkpoint root (None: a remote one) are claimed."""
        fds = (job.lock_fd, *(() if root_lock is None else root_lock.fds))
        locks = tuple(fd for fd in fds if fd is not None)
        launch = Launcher(
            command=self.command,
            options=self.options,
            job_id=self.job_id,
            job_dir=job.path,
            checkpoint_dir=self.checkpoint_dir,
            locks=locks,
        )
        pump = SignalPump(self.options.stop_signals, self.options.grace_seconds, job)
        return RunningJob(job, launch, pump, WarmSlot(job), self.scheduler, self.gate)

    def _begin(self, job: JobDir, slot: WarmSlot) -> None:
        """The job's first records of this run; the requests of its last run refused."""
        # Requests that came while the job's last run stopped were for that run, not this one.
        answer_left(job, "the job stopped before it took this request; ask again now")
        slot.refuse_left("the job stopped before it took this request; ask again now")
        if self.options.fresh:
            log.info("%s", start_over(self.checkpoint_dir))
        identity = Identity(
            id=self.job_id,
            command=self.command,
            cwd=os.getcwd(),
            user=_user(),
            supervisor_pid=os.getpid(),
            worker_pid=None,
            checkpoint_dir=self.checkpoint_dir,
            scheduler=self.scheduler.name,
            scheduler_restarts=self.scheduler.restart_count(),
        )
        if self.node is not None:
            identity["node"], identity["nodes"] = self.node, self.nodes.count
        job.write_identity(**identity)
        # A new run: what the previous one concluded no longer holds (checkpoints stay listed).
        job.update_status(
            "starting",
            supervisor_pid=os.getpid(),
            worker_pid=None,
            exit_code=None,
            error=None,
            restart=None,
            restarts=0,
            max_restarts=self.options.max_restarts,
            failures=0,
            started=time.time(),
        )
        job.event("run_start", supervisor_pid=os.getpid(), command=self.command)
        where = "" if self.node is None else f", {self.node} of {self.nodes.count} nodes"
        log.info("ferry run: job %s%s (%s)", self.job_id, where, self.identity.why)
        log.info(
            "ferry run: checkpoints under %s (%s); job directory %s",
            self.checkpoint_dir,
            "--dir" if self.options.dir else "the default: ./ferry-checkpoints/JOB",
            job.path,
        )


def _user() -> str:
    """This user's name, for the job's record (the uid where it has none)."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())
