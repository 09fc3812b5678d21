"""SLURM: ``--signal=B:USR1@T`` means "checkpoint now"; the job requeues itself.

The batch script ``exec``s ``ferry run`` so that the supervisor *is* the batch shell that
``B:`` signals reach. On the signal the worker checkpoints and exits with the checkpoint
code; the supervisor then calls ``after_checkpoint``, which runs ``scontrol requeue`` for
the job (array-aware: ``<array job id>_<task id>``) exactly once per preemption:

* a claim file ``slurm-requeue-<restart>.json`` in the job directory, created with
  O_EXCL, makes a second layer (a second signal, another rank, a retry) a no-op;
* a retry budget: no requeue once ``SLURM_RESTART_COUNT`` reached ``max_requeues``;
* no loop: no requeue when the step did not move since the previous requeue.

On the restart SLURM keeps the job id and sets ``SLURM_RESTART_COUNT``: the job id names
the ferry job (``slurm-<id>``), hence its checkpoint folder, and the job resumes.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ferry.knobs import SLURM_MAX_REQUEUES as DEFAULT_MAX_REQUEUES
from ferry.schedulers.base import AdapterDefaults

log = logging.getLogger("ferry.run")


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

    def after_checkpoint(self, *, step: int | None, code: int, state_dir: str) -> int:
        job, restart = self.slurm_job_id, self.restart_count()
        if restart >= self.max_requeues:
            log.error(
                "ferry run: SLURM job %s was requeued %d times (FERRY_SLURM_MAX_REQUEUES=%d): not "
                "requeuing again; the checkpoint stays, resubmit the job to go on",
                job,
                restart,
                self.max_requeues,
            )
            return code
        previous = _read(os.path.join(state_dir, f"slurm-requeue-{restart - 1}.json"))
        if previous is not None and previous.get("step") == step:
            log.error(
                "ferry run: SLURM job %s made no progress since its last requeue (still step %s): "
                "not requeuing, to avoid a requeue loop; look at the job's output for why",
                job,
                step,
            )
            return code
        claim = os.path.join(state_dir, f"slurm-requeue-{restart}.json")
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            log.info("ferry run: SLURM job %s was already requeued for this preemption", job)
            return code
        with os.fdopen(fd, "w") as f:
            json.dump({"job": job, "restart": restart, "step": step, "time": time.time()}, f)
        if shutil.which(self.scontrol, path=self.env.get("PATH")) is None:
            log.error(
                "ferry run: cannot requeue SLURM job %s: %r is not on PATH; the checkpoint at step "
                "%s is committed: resubmit the job (same --job-id or --dir) to resume, or put "
                "SLURM's bin folder on PATH",
                job,
                self.scontrol,
                step,
            )
            os.unlink(claim)
            return code
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
            return code
        log.info(
            "ferry run: checkpointed at step %s; requeued SLURM job %s (restart %d)", step, job, restart + 1
        )
        return code


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def detect(env: Mapping[str, str]) -> SlurmAdapter | None:
    if not env.get("SLURM_JOB_ID"):
        return None
    return SlurmAdapter(
        env=dict(env),
        max_requeues=int(env.get("FERRY_SLURM_MAX_REQUEUES") or DEFAULT_MAX_REQUEUES),
        scontrol=env.get("FERRY_SLURM_SCONTROL") or "scontrol",
    )


# ------------------------------------------------------------------ sbatch scripts


@dataclass(frozen=True, kw_only=True)
class SbatchSpec:
    """What an sbatch script for a ferry job says."""

    command: Sequence[str]
    """The training command, run under ``ferry run``."""
    job_name: str = "ferry-train"
    """``--job-name``."""
    grace_seconds: int = 120
    """SLURM signals this long before the time limit (``--signal=B:USR1@T``); ferry run
    SIGKILLs the worker 10 s before that runs out."""
    time_limit: str | None = None
    """``--time``, e.g. ``04:00:00``; None: the partition's."""
    output: str = "%x-%j.out"
    """``--output``; appended to across requeues."""
    extra: Sequence[str] = ()
    """More ``#SBATCH`` options, e.g. ``--gres=gpu:1``."""
    ferry: Sequence[str] = ("ferry",)
    """How to call ferry."""
    ferry_options: Sequence[str] = ()
    """Options for ``ferry run``, e.g. ``--every-seconds 600``."""

    def __post_init__(self) -> None:
        if self.grace_seconds <= 10:
            raise ValueError(
                f"grace_seconds must be > 10 (ferry keeps 10 s of margin), got {self.grace_seconds}"
            )
        if not self.command:
            raise ValueError("command is empty: give the training command, e.g. ['python', 'train.py']")


def sbatch_script(spec: SbatchSpec) -> str:
    """A pure function: the sbatch script for ``spec``, byte for byte."""
    options = [
        f"--job-name={spec.job_name}",
        f"--signal=B:USR1@{spec.grace_seconds}",
        "--requeue",
        "--open-mode=append",
        f"--output={spec.output}",
    ]
    if spec.time_limit:
        options.append(f"--time={spec.time_limit}")
    options.extend(spec.extra)
    run = [*spec.ferry, "run", "--grace", str(spec.grace_seconds - 10), *spec.ferry_options, "--"]
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {o}" for o in options),
        "# Generated by ferry.schedulers.slurm.sbatch_script.",
        "# USR1 reaches the batch shell (B:), which exec made ferry run: the job checkpoints,",
        "# requeues itself (scontrol requeue) and resumes from its checkpoint when it restarts.",
        'echo "ferry: SLURM job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0} on $(hostname)"',
        f"exec {shlex.join(run)} {shlex.join(spec.command)}",
        "",
    ]
    return "\n".join(lines)
