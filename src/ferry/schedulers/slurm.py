"""SLURM: ``--signal=B:USR1@T`` means "checkpoint now"; the job requeues itself.

The batch script ``exec``s ``ferry run`` so that the supervisor *is* the batch shell that
``B:`` signals reach. On the signal the worker commits a checkpoint and exits with the
checkpoint code; the supervisor records the job's end, then calls ``after_checkpoint``
last of all, because SLURM kills the batch step soon after ``scontrol requeue``. It runs
``scontrol requeue`` for the job (array-aware: ``<array job id>_<task id>``) exactly once
per preemption:

* a claim file ``slurm-requeue-<slurm job>-<restart>.json`` in the job directory, written
  under a lock before ``scontrol`` runs, makes a second layer (a second signal, another
  supervisor, a retry) a no-op. A claim counts only when it is this SLURM job's (cluster,
  job and array task, restart count) and was written after this process started: a ferry
  job id reused by a later SLURM job, even one whose id SLURM handed out again (a cluster
  whose state was reset starts again at job 1), finds no claim of its own and requeues;
* a retry budget: no requeue once ``SLURM_RESTART_COUNT`` reached ``max_requeues``;
* no loop: no requeue when the step did not move since this SLURM job's previous requeue.

On the restart SLURM keeps the job id and sets ``SLURM_RESTART_COUNT``: the job id names
the ferry job (``slurm-<id>``), hence its checkpoint folder, and the job resumes.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import logging
import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from ferry.errors import ConfigError, JobError, bug
from ferry.knobs import SLURM_MAX_REQUEUES as DEFAULT_MAX_REQUEUES
from ferry.runtime.atomicjson import write_json_atomic
from ferry.runtime.jobdir import read_json, report_dropped
from ferry.schedulers.base import AdapterDefaults
from ferry.schedulers.sbatch import SbatchSpec, sbatch_script
from ferry.typedjson import SchemaError, parse

__all__ = ["SbatchSpec", "SlurmAdapter", "detect", "sbatch_script"]

log = logging.getLogger("ferry.run")

CLOCK_SLACK_SECONDS = 2.0
"""A claim written this long before the process started still counts as its own: the start
time read from /proc is good to about a second; a claim from an earlier SLURM job predates
it by the time that job took to end and this one to be scheduled."""

MAX_CLAIM_BYTES = 4096
"""A claim is about 100 bytes; a bigger file is not ferry's, and is not read."""


class RequeueClaim(TypedDict):
    """``slurm-requeue-<slurm job>-<restart>.json`` as ``SlurmRun.claim`` writes it."""

    job: str
    cluster: str | None
    restart: int
    step: int | None
    time: float


@dataclass(frozen=True, kw_only=True)
class SlurmRun:
    """One run of one SLURM job: what a requeue claim is keyed to."""

    job: str
    """``<job id>``, or ``<array job id>_<task id>`` for an array task: what ``scontrol
    requeue`` takes."""
    cluster: str | None
    """``SLURM_CLUSTER_NAME``: two clusters (or one whose state was reset) reuse job ids."""
    restart: int
    """``SLURM_RESTART_COUNT``: 0 on the first run, one more after each requeue."""
    started: float | None
    """When this process started (epoch seconds), None where /proc cannot say."""

    def claim(self, step: int | None) -> RequeueClaim:
        return RequeueClaim(
            job=self.job, cluster=self.cluster, restart=self.restart, step=step, time=time.time()
        )

    def owns(self, claim: Mapping[str, Any] | None, restart: int) -> bool:
        """Was ``claim`` written by this SLURM job at ``restart``?"""
        return (
            claim is not None
            and claim.get("job") == self.job
            and claim.get("cluster") == self.cluster
            and claim.get("restart") == restart
        )


class Decision(enum.Enum):
    REQUEUE = "requeue"
    BUDGET_SPENT = "budget spent"
    NO_PROGRESS = "no progress"
    ALREADY_REQUEUED = "already requeued"


def requeue_decision(
    run: SlurmRun,
    *,
    step: int | None,
    max_requeues: int,
    claim: Mapping[str, Any] | None,
    previous: Mapping[str, Any] | None,
) -> Decision:
    """Pure: whether this run asks SLURM for a requeue, given the claim files under its key
    (``claim``: this restart's, ``previous``: the restart before; None when absent)."""
    if run.restart >= max_requeues:
        return Decision.BUDGET_SPENT
    if run.owns(claim, run.restart):
        if claim is None:
            raise bug("a requeue claim owned but absent")
        written = claim.get("time")
        stale = (
            run.started is not None
            and isinstance(written, (int, float))
            and written < run.started - CLOCK_SLACK_SECONDS
        )
        if not stale:  # else an earlier SLURM job with the same id wrote it (ids start again at 1)
            return Decision.ALREADY_REQUEUED
    if run.restart > 0 and run.owns(previous, run.restart - 1):
        if previous is None:
            raise bug("the previous requeue claim owned but absent")
        if previous.get("step") == step:
            return Decision.NO_PROGRESS
    return Decision.REQUEUE


def claim_name(job: str, restart: int) -> str:
    """The claim file of SLURM job ``job`` at ``restart``, safe as a file name."""
    return f"slurm-requeue-{re.sub(r'[^A-Za-z0-9_.]', '-', job)}-{restart}.json"


@dataclass(frozen=True)
class SlurmAdapter(AdapterDefaults):
    env: Mapping[str, str] = field(repr=False)
    name: str = "slurm"
    stop_signal: str = "SIGUSR1"
    max_requeues: int = DEFAULT_MAX_REQUEUES
    """Requeues allowed (``FERRY_SLURM_MAX_REQUEUES``); past it the job ends checkpointed."""
    scontrol: str = "scontrol"
    """The command that requeues (``FERRY_SLURM_SCONTROL``), found on PATH."""

    @property
    def slurm_job_id(self) -> str:
        array, task = self.env.get("SLURM_ARRAY_JOB_ID"), self.env.get("SLURM_ARRAY_TASK_ID")
        if array and task:
            return f"{array}_{task}"
        return self.env["SLURM_JOB_ID"]

    def job_id(self) -> str | None:
        return f"slurm-{self.slurm_job_id}"

    def restart_count(self) -> int:
        try:
            return int(self.env.get("SLURM_RESTART_COUNT") or 0)
        except ValueError:
            return 0

    def run(self) -> SlurmRun:
        return SlurmRun(
            job=self.slurm_job_id,
            cluster=self.env.get("SLURM_CLUSTER_NAME") or None,
            restart=self.restart_count(),
            started=process_start(os.getpid()),
        )

    @property
    def step_tasks(self) -> tuple[int, int]:
        """(this task, the tasks) of the job step that runs this process (``srun``: one
        ``ferry run`` per node); (0, 1) in the batch script itself."""
        if not self.env.get("SLURM_STEP_ID"):
            return 0, 1
        try:
            return int(self.env.get("SLURM_PROCID") or 0), int(self.env.get("SLURM_STEP_NUM_TASKS") or 1)
        except ValueError:
            return 0, 1

    def after_checkpoint(self, *, step: int | None, code: int, state_dir: str) -> int:
        task, tasks = self.step_tasks
        if task != 0:  # a job on many nodes is requeued once, by its first task
            log.info(
                "ferry run: checkpointed at step %s; SLURM job %s is requeued by task 0 of its %d, not "
                "by this one (task %d)",
                step,
                self.slurm_job_id,
                tasks,
                task,
            )
            return code
        run = self.run()
        try:
            self._decide(run, step, state_dir)
        except JobError as exc:
            log.error("ferry run: not requeuing SLURM job %s: %s", run.job, exc)
        return code

    def _decide(self, run: SlurmRun, step: int | None, state_dir: str) -> None:
        job, restart = run.job, run.restart
        claim = os.path.join(state_dir, claim_name(job, restart))
        # The lock makes read, decide, claim and requeue one step for every layer of the job.
        with _locked(os.path.join(state_dir, "slurm-requeue.lock"), step):
            decision = requeue_decision(
                run,
                step=step,
                max_requeues=self.max_requeues,
                claim=_read(claim),
                previous=_read(os.path.join(state_dir, claim_name(job, restart - 1))) if restart else None,
            )
            if decision is Decision.BUDGET_SPENT:
                log.error(
                    "ferry run: SLURM job %s was requeued %d times (FERRY_SLURM_MAX_REQUEUES=%d): not "
                    "requeuing again; the checkpoint stays, resubmit the job to go on",
                    job,
                    restart,
                    self.max_requeues,
                )
            elif decision is Decision.NO_PROGRESS:
                log.error(
                    "ferry run: SLURM job %s made no progress since its last requeue (still step %s): "
                    "not requeuing, to avoid a requeue loop; look at the job's output for why",
                    job,
                    step,
                )
            elif decision is Decision.ALREADY_REQUEUED:
                log.info("ferry run: SLURM job %s was already requeued for this preemption", job)
            else:
                self._requeue(run, step, claim)

    def _requeue(self, run: SlurmRun, step: int | None, claim: str) -> None:
        job = run.job
        if shutil.which(self.scontrol, path=self.env.get("PATH")) is None:
            log.error(
                "ferry run: cannot requeue SLURM job %s: %r is not on PATH; the checkpoint at step "
                "%s is committed: resubmit the job (same --job-id or --dir) to resume, or put "
                "SLURM's bin folder on PATH",
                job,
                self.scontrol,
                step,
            )
            return
        # The claim is durable before SLURM hears of the requeue: once scontrol returns, SLURM
        # may kill this process at any moment.
        write_json_atomic(claim, run.claim(step), durable=True)
        log.info("ferry run: checkpointed at step %s; requeuing SLURM job %s", step, job)
        done = subprocess.run(
            [self.scontrol, "requeue", job], capture_output=True, text=True, env=dict(self.env), check=False
        )
        if done.returncode != 0:
            os.unlink(claim)
            log.error(
                "ferry run: `scontrol requeue %s` failed (%d): %s; the checkpoint at step %s is "
                "committed: resubmit the job to resume (JobRequeue=1 or sbatch --requeue allows it)",
                job,
                done.returncode,
                done.stderr.strip(),
                step,
            )
            return
        log.info("ferry run: requeued SLURM job %s (restart %d)", job, run.restart + 1)


def process_start(pid: int) -> float | None:
    """When process ``pid`` started, in epoch seconds, from /proc; None where it cannot say."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22, starttime
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


@contextlib.contextmanager
def _locked(path: str, step: int | None) -> Iterator[None]:
    """Hold the requeue lock ``path``, created 0600 where missing. A symlink planted there is
    not followed (it could make this user create or lock another user's file), nor is anything
    but a regular file used: JobError, saying what to do."""
    fix = f"remove it, then resubmit the job to resume from its checkpoint (step {step})"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise JobError(
                f"its lock {path} is a symbolic link, which ferry does not follow; {fix}"
            ) from None
        raise JobError(f"cannot open its lock {path} ({exc.strerror or exc}); {fix}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise JobError(f"its lock {path} is not a regular file; {fix}")
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(path: str) -> RequeueClaim | None:
    """The claim at ``path``; None when there is none. One that is not a small regular file of
    well-typed fields (a symlink, a FIFO, a garbled or foreign file) counts as none, said once
    in the log: the claim this run writes replaces it."""
    try:
        raw = read_json(path, MAX_CLAIM_BYTES)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        report_dropped(f"a SLURM requeue claim is ignored: {exc}")
        return None
    try:
        return parse(raw, RequeueClaim)
    except SchemaError as exc:
        report_dropped(f"the SLURM requeue claim {path} is ignored: {exc}")
        return None


def _max_requeues(env: Mapping[str, str]) -> int:
    raw = env.get("FERRY_SLURM_MAX_REQUEUES") or ""
    if not raw:
        return DEFAULT_MAX_REQUEUES
    if not raw.strip().isdigit():
        raise ConfigError(
            f"FERRY_SLURM_MAX_REQUEUES={raw!r}: set it to a whole number of requeues, 0 or more "
            f"(default {DEFAULT_MAX_REQUEUES})"
        )
    return int(raw)


def detect(env: Mapping[str, str]) -> SlurmAdapter | None:
    if not env.get("SLURM_JOB_ID"):
        return None
    return SlurmAdapter(
        env=dict(env),
        max_requeues=_max_requeues(env),
        scontrol=env.get("FERRY_SLURM_SCONTROL") or "scontrol",
    )
