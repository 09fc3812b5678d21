"""The warm path of ``ferry migrate`` (docs/jobs.md, "Warm migration"): what the preflight
looks at, and the migration itself.

1. ask the supervisor for a warm worker with the target devices (``supervisor/warm.py``)
   and wait until it waits at its restore point: the job trains on meanwhile;
2. send the worker the ``restart`` request, as the cold path does: it drains to its next
   safe point, commits its checkpoint, leaves the state in host memory and exits;
3. the supervisor releases the warm worker instead of starting one; it takes the state
   over, restores it and trains: its ``resume`` and ``first_step`` events end the downtime.
"""

from __future__ import annotations

import os
import time

from ferry.errors import JobError
from ferry.knobs import PROCESS_POLL_SECONDS
from ferry.ops.jobs import JobRecord, command_of, process_env
from ferry.ops.requests import send, wait_answer
from ferry.ops.warmcheck import WarmFacts
from ferry.progress import Meter, Progress
from ferry.runtime.events import Event
from ferry.runtime.jobfiles import Response
from ferry.runtime.procs import descendants
from ferry.supervisor import warm

_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def facts(record: JobRecord, target: str) -> WarmFacts:
    """What the preflight needs, read from the job's files, /proc and NVML."""
    command = command_of(record)
    launcher = next(
        (word for word in command[:3] for name in _LAUNCHERS if os.path.basename(word) == name), None
    )
    pid = record.worker_pid
    env = (process_env(pid) if pid else None) or {}
    try:
        world = int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        world = 1
    last = record.status.get("last_checkpoint")
    gpu_needed, gpu_free = _gpu(pid, target)
    return WarmFacts(
        launcher=launcher,
        world_size=world,
        mem_available=_mem_available(),
        worker_rss=sum(_rss(p) for p in descendants(pid)) if pid else 0,
        state_bytes=int(last["bytes"]) if last else 0,
        gpu_needed=gpu_needed,
        gpu_free=gpu_free,
    )


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _gpu(pid: int | None, target: str) -> tuple[int, dict[str, int]]:
    """The worker's memory on its busiest GPU, and each target GPU's free memory; (0, {})
    where NVML cannot tell (no GPU here: a CPU job needs no device memory)."""
    from ferry.process import nvml

    if pid is None or nvml.status() is not None:
        return 0, {}
    try:
        used = max((u.used_bytes for u in nvml.process_usage(pid)), default=0)
        gpus = nvml.gpus()
    except Exception:  # NVML errors of every kind: the check is then left out, not the move
        return 0, {}
    by_index = {str(g.index): g.memory_free for g in gpus}
    by_uuid = {str(g.uuid).lower(): g.memory_free for g in gpus}
    free = {}
    for item in target.split(","):
        value = by_index.get(item) if item.isdigit() else by_uuid.get(item.lower())
        if value is not None:
            free[item] = value
    return used, free


def first_step(event: Event | None) -> float | None:
    """The first step's warm-up, from a ``first_step`` event: its length beyond the second's."""
    if event is None:
        return None
    return max(0.0, float(event.get("seconds", 0.0)) - float(event.get("next_seconds", 0.0)))


def _events(record: JobRecord, since: float, kind: str, pid: int | None = None) -> list[Event]:
    return [
        e
        for e in record.dir.events()
        if e["event"] == kind and e["time"] >= since and (pid is None or e.get("pid") == pid)
    ]


def start_warm(
    record: JobRecord, target: str, timeout: float, progress: Progress
) -> tuple[int, float, float]:
    """Have the supervisor start the warm worker and wait until it is ready; returns its pid,
    its start-up seconds and when it was asked for. JobError when it cannot be had."""
    asked = time.time()
    rid = warm.submit(record.dir, {"CUDA_VISIBLE_DEVICES": target}, expires=3 * timeout)
    progress(f"job {record.id}: starting the worker on {target} beside the running one (warm start)")
    try:
        answer = wait_answer(record, rid, timeout)
    except JobError as exc:
        raise JobError(
            f"warm migration failed: {exc}; nothing was moved (`ferry migrate --cold` restarts it instead)"
        ) from None
    pid, seconds = int(answer.get("pid", 0)), float(answer.get("seconds", 0.0))
    progress(
        f"job {record.id}: warm worker pid {pid} waits at its restore point ({seconds:.1f} s of start-up)"
    )
    return pid, seconds, asked


def hand_over(
    record: JobRecord, target: str, timeout: float, progress: Progress, meter: Meter | None = None
) -> tuple[Response, float]:
    """Ask the worker to stop for the restart; returns its answer and when it was asked.
    ``meter`` draws its save meanwhile."""
    t0 = time.time()
    rid = send(record, "restart", {"CUDA_VISIBLE_DEVICES": target})
    progress(f"job {record.id}: checkpointing at its next safe point for the hand-over")
    return wait_answer(record, rid, timeout, progress, meter), t0


def taken_over(
    record: JobRecord, since: float, step: int, timeout: float
) -> tuple[Event, Event, Event | None]:
    """The restart, resume and first_step events of the worker that took over after
    ``since`` (first_step None: the job ended, or ``timeout`` ran out, before two steps: the
    move is done all the same, only its first step's warm-up is unknown)."""
    deadline = time.monotonic() + timeout
    while True:
        restarts = _events(record, since, "restart")
        if restarts:
            pid = restarts[-1].get("pid")
            resumed = _events(record, since, "resume")
            if resumed:
                resume = resumed[-1]
                if resume.get("step") != step:
                    raise JobError(
                        f"job {record.id} resumed at step {resume.get('step')}, not at the step {step} "
                        f"it saved (from {resume.get('url')}): see its log"
                    )
                first = _events(record, since, "first_step")
                if first:
                    return restarts[-1], resume, first[-1]
                gone = not record.refresh().alive or record.worker_pid != pid
                if gone or time.monotonic() > deadline:
                    return restarts[-1], resume, None
        elif not record.refresh().alive:
            raise JobError(
                f"job {record.id} stopped after its checkpoint instead of restarting ({record.state}); "
                "resume it with `ferry run` or `ferry resume`"
            )
        if time.monotonic() > deadline:
            raise JobError(f"job {record.id} did not resume within {timeout:g} s; see `ferry status`")
        time.sleep(PROCESS_POLL_SECONDS)
