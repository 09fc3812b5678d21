"""Move a job in place, to other devices on its node (``migrate``); moves to another node
go through a bundle (``ferry.ops.bundle``).

Migration is a ``restart`` control request (docs/jobs.md): the worker commits a checkpoint,
leaves its state in host memory and exits, and the new worker, on the new
``CUDA_VISIBLE_DEVICES``, restores it. Warm (``warmmove``), the new worker was started
beside the old one and waits at its restore point; cold, the supervisor starts it after
the old one exited.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ferry.errors import ConfigError, JobError
from ferry.ops import devices, warmmove
from ferry.ops.jobs import JobRecord
from ferry.ops.requests import require_alive, send, wait_answer
from ferry.ops.warmcheck import cold_reason
from ferry.progress import Meter, Progress
from ferry.runtime.events import Event
from ferry.runtime.jobfiles import Response


@dataclass
class Migration:
    job: str
    source: str | None
    target: str
    step: int
    url: str
    pid: int
    drain: float
    """From the request to the old worker's next safe point (it trains meanwhile)."""
    save: float
    """The old worker's checkpoint, committed."""
    restart: float
    """Cold: from the commit to the new worker's restore (a process start). Warm: 0."""
    restore: float
    """The new worker's restore, its load included."""
    first_step: float | None = None
    """How much longer the new worker's first step took than its second: its warm-up (caches,
    lazy initialization, CUDA kernels); the steps themselves train (None: no two steps came)."""
    warm: bool = False
    """The target worker was started beside the old one (docs/jobs.md, "Warm migration")."""
    handover: float = 0.0
    """Warm: from the old worker's save to the warm worker's restore: the save, the state left in
    host memory, the old worker's exit, the release of the warm one."""
    warm_startup: float = 0.0
    """Warm: the warm worker's start-up to its restore point, while the old one trained."""
    cold_reason: str | None = None
    """Why the migration restarted cold (None: it went warm)."""

    @property
    def downtime(self) -> float:
        if self.warm:
            return self.drain + self.handover + self.restore + (self.first_step or 0.0)
        return self.drain + self.save + self.restart + self.restore

    def to_dict(self) -> dict[str, object]:
        return {**self.__dict__, "downtime": self.downtime}


def migrate(
    record: JobRecord,
    target: str,
    timeout: float,
    progress: Progress,
    *,
    unchecked: bool = False,
    cold: bool = False,
    meter: Meter | None = None,
) -> Migration:
    """Move the job to ``target`` devices and return once its new worker resumed and took a step.

    Warm (docs/jobs.md): the new worker starts beside the old one and waits at its restore
    point; the old one then checkpoints, hands its state over and exits. Cold, where the
    preflight (``warmcheck``) says the job cannot run twice at once, or ``cold`` asks for it:
    the old worker checkpoints and exits, and the supervisor starts the new one.

    Where the devices cannot be checked (no NVML), CUDA would start the worker on whatever
    it finds, or on no GPU at all, and the job would train somewhere else than asked:
    refused unless ``unchecked`` (``--unchecked-devices``) says to go on. ``meter`` draws
    the old worker's save while it is waited for."""
    require_alive(record, "migrate")
    if not record.supervised:
        raise JobError(
            f"job {record.id} runs without `ferry run`: nobody can restart it in place; use "
            "`ferry export` and `ferry resume`, or start it as `ferry run --max-restarts N -- ...`"
        )
    allowed = record.status.get("max_restarts")
    done = int(record.status.get("restarts") or 0)
    if allowed is not None and done >= int(allowed):
        raise JobError(
            f"job {record.id} has no in-place restart left ({done} of {allowed} used): start it with "
            "`ferry run --max-restarts N` to migrate it, or use `ferry export` and `ferry resume`"
        )
    current = record.devices()
    target, warning = devices.check(target)
    if devices.same(current, target):
        raise ConfigError(f"job {record.id} already runs on CUDA_VISIBLE_DEVICES={target}: nothing to move")
    if warning and not unchecked:
        raise ConfigError(
            f"refused: {warning}; a device that does not exist is silently ignored by CUDA, so the "
            "job could resume on other GPUs or on the CPU: check with nvidia-smi, then pass "
            "--unchecked-devices to move it anyway"
        )
    if warning:
        progress(f"warning: {warning}")
    reason = "asked for (--cold)" if cold else cold_reason(warmmove.facts(record, target))
    if reason is None:
        return _migrate_warm(record, current, target, timeout, progress, meter)
    progress(f"job {record.id}: cold migration (the worker restarts): {reason}")
    t0 = time.time()
    rid = send(record, "restart", {"CUDA_VISIBLE_DEVICES": target})
    progress(
        f"job {record.id}: checkpointing at its next safe point (devices {current or 'all'} -> {target})"
    )
    answer = wait_answer(record, rid, timeout, progress, meter)
    then = f"restarting on {target}"
    moved, _, _ = _committed(record, current, target, answer, t0, then, timeout, progress)
    return replace(moved, cold_reason=reason)


def _committed(
    record: JobRecord,
    current: str | None,
    target: str,
    answer: Response,
    t0: float,
    then: str,
    timeout: float,
    progress: Progress,
) -> tuple[Migration, Event, float]:
    """A move once the old worker answered (``answer``: its checkpoint committed) the
    request sent at ``t0``: says so and ``then``, waits for the new worker's resume and
    first steps, and returns the move as a cold restart counts it, the new worker's
    ``restart`` event, and the seconds from the commit to the new worker's restore (the
    ``restart`` part before it is clamped at 0)."""
    step, url, save = int(answer["step"]), str(answer["url"]), float(answer.get("seconds", 0))
    committed = float(answer.get("time", time.time()))
    progress(f"job {record.id}: checkpoint of step {step} committed ({save:.2f} s); {then}")
    restart, resume, first = warmmove.taken_over(record, t0, step, timeout)
    restore = float(resume.get("seconds", 0))
    gap = resume["time"] - restore - committed
    moved = Migration(
        job=record.id,
        source=current,
        target=target,
        step=step,
        url=url,
        pid=int(restart.get("pid") or 0),
        drain=max(0.0, committed - save - t0),
        save=save,
        restart=max(0.0, gap),
        restore=restore,
        first_step=warmmove.first_step(first),
    )
    return moved, restart, gap


def _migrate_warm(
    record: JobRecord,
    current: str | None,
    target: str,
    timeout: float,
    progress: Progress,
    meter: Meter | None = None,
) -> Migration:
    pid, startup, _ = warmmove.start_warm(record, target, timeout, progress)
    answer, t0 = warmmove.hand_over(record, target, timeout, progress, meter)
    then = f"handing over to pid {pid}"
    moved, restart, gap = _committed(record, current, target, answer, t0, then, timeout, progress)
    if not (restart.get("warm") and restart.get("pid") == pid):
        why = "the warm worker was gone at the hand-over: the worker restarted"
        return replace(moved, warm_startup=startup, cold_reason=why)
    return replace(
        moved,
        restart=0.0,
        warm=True,
        handover=max(0.0, moved.save + gap),  # from the start of the save to the restore
        warm_startup=startup,
    )


# ---------------------------------------------------------------------- bundles
__all__ = ["Migration", "migrate"]
