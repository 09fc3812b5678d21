"""``CudaProcess``: freeze a running CUDA process, release its GPU, and continue it later.

The driver's state machine (cuCheckpointProcess*)::

    RUNNING --lock--> LOCKED --checkpoint--> CHECKPOINTED --restore--> LOCKED --unlock--> RUNNING

FAILED is terminal. Each public method checks the current state against ``TRANSITIONS``
before it calls the driver, so an operator gets "lock it first" rather than a bare
``CUDA_ERROR_ILLEGAL_STATE``. ``suspend`` and ``wake`` are the two-step operations the
CLI offers; they are idempotent (suspending a suspended process does nothing) and
``suspend`` unlocks the process again if the checkpoint step fails.

``suspend`` records which GPUs the process held (through NVML, while it still holds
them) in ``<FERRY_HOME>/process/<pid>.json``, so that a later ``wake`` with a GPU mapping,
in another process, can check that the mapping covers all of them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ferry.errors import ConfigError, ProcessCheckpointError
from ferry.process import nvml, preflight
from ferry.process.driver import Driver, ProcessState, check_permission, load_driver
from ferry.process.nvml import GpuUsage
from ferry.process.uuids import GpuMapping, GpuUuid, MappingInput, complete_mapping, normalize_mapping
from ferry.runtime.atomicjson import write_json_atomic
from ferry.runtime.jobdir import ferry_home, read_json

TRANSITIONS: dict[str, tuple[ProcessState, ProcessState]] = {
    "lock": (ProcessState.RUNNING, ProcessState.LOCKED),
    "checkpoint": (ProcessState.LOCKED, ProcessState.CHECKPOINTED),
    "restore": (ProcessState.CHECKPOINTED, ProcessState.LOCKED),
    "unlock": (ProcessState.LOCKED, ProcessState.RUNNING),
}

_WHAT_TO_DO: dict[tuple[str, ProcessState], str] = {
    ("lock", ProcessState.LOCKED): "it is already locked",
    ("lock", ProcessState.CHECKPOINTED): "it is suspended; wake it (restore, unlock) first",
    ("checkpoint", ProcessState.RUNNING): "lock it first (`ferry suspend` locks and checkpoints)",
    ("checkpoint", ProcessState.CHECKPOINTED): "it is already checkpointed",
    ("restore", ProcessState.RUNNING): "it is not suspended",
    ("restore", ProcessState.LOCKED): "it is not checkpointed (restored already, or only locked): unlock it",
    ("unlock", ProcessState.RUNNING): "it is not locked",
    ("unlock", ProcessState.CHECKPOINTED): "restore it first (`ferry wake` restores and unlocks)",
}

# The driver steps that take a process from each state to "suspended" or "awake".
PLANS: dict[str, dict[ProcessState, tuple[str, ...]]] = {
    "suspend": {
        ProcessState.RUNNING: ("lock", "checkpoint"),
        ProcessState.LOCKED: ("checkpoint",),
        ProcessState.CHECKPOINTED: (),
    },
    "wake": {
        ProcessState.CHECKPOINTED: ("restore", "unlock"),
        ProcessState.LOCKED: ("unlock",),
        ProcessState.RUNNING: (),
    },
}


def check_transition(op: str, state: ProcessState, pid: int) -> None:
    """Raise, saying what to do, unless the driver allows ``op`` from ``state``."""
    if op not in TRANSITIONS:
        raise ConfigError(f"unknown operation {op!r}; one of {', '.join(TRANSITIONS)}")
    _require_usable(state, pid)
    needed = TRANSITIONS[op][0]
    if state != needed:
        hint = _WHAT_TO_DO.get((op, state), "")
        raise ProcessCheckpointError(
            f"cannot {op} pid {pid}: it is {state.value}, {op} needs "
            f"{needed.value}" + (f"; {hint}" if hint else "")
        )


def plan(action: str, state: ProcessState, pid: int) -> tuple[str, ...]:
    """The driver steps ``suspend`` or ``wake`` take from ``state`` (empty: already there)."""
    _require_usable(state, pid)
    return PLANS[action][state]


def _require_usable(state: ProcessState, pid: int) -> None:
    if state == ProcessState.FAILED:
        raise ProcessCheckpointError(
            f"the driver reports that pid {pid} failed during a checkpoint or "
            "restore; it cannot be recovered: stop it and resume from a "
            "framework-level checkpoint"
        )
    if state in (ProcessState.CHECKPOINTING, ProcessState.RESTORING):
        raise ProcessCheckpointError(
            f"pid {pid} is {state.value} (another tool is moving its memory); wait and retry"
        )


def check_pid(pid: object) -> int:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise ConfigError(f"a PID is a positive integer, got {pid!r}")
    return pid


def start_time(pid: int) -> int | None:
    """Clock ticks since boot at which ``pid`` started: tells a process from a later one with its PID."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the name in (...) may hold spaces


def require_alive(pid: int) -> None:
    if start_time(pid) is None:
        raise ProcessCheckpointError(
            f"no process with pid {pid} on this machine (it exited, or lives in another PID namespace)"
        )


@dataclass
class SuspendRecord:
    """What ``suspend`` knew about the process, for a later ``wake`` (possibly another ferry)."""

    pid: int
    start_time: int | None
    gpus: list[GpuUsage] | None
    """GPUs the process held when it was locked; None when NVML was unavailable."""
    opened: list[GpuUuid] = field(default_factory=list)
    """GPUs whose device files it had open (a mapping must place these too)."""
    suspended_at: float = field(default_factory=time.time)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "start_time": self.start_time,
            "suspended_at": self.suspended_at,
            "gpus": None if self.gpus is None else [g.to_dict() for g in self.gpus],
            "opened": [str(g) for g in self.opened],
            "warnings": self.warnings,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> SuspendRecord:
        gpus = doc.get("gpus")
        return cls(
            int(doc["pid"]),
            doc.get("start_time"),
            None if gpus is None else [GpuUsage.from_dict(g) for g in gpus],
            [GpuUuid.parse(g) for g in doc.get("opened", [])],
            float(doc.get("suspended_at", 0.0)),
            list(doc.get("warnings", [])),
        )


def record_path(pid: int) -> str:
    return os.path.join(ferry_home(), "process", f"{pid}.json")


def save_record(record: SuspendRecord) -> str:
    path = record_path(record.pid)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    write_json_atomic(path, record.to_dict())
    return path


def load_record(pid: int) -> SuspendRecord | None:
    """The record of ``pid``'s suspend, unless it is missing or belongs to an earlier process."""
    try:
        record = SuspendRecord.from_dict(read_json(record_path(pid)))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if record.start_time is not None and record.start_time != start_time(pid):
        return None
    return record


def drop_record(pid: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(record_path(pid))


def lock_timeout_ms(timeout: float | None) -> int:
    if timeout is None:
        return 0
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < 4_294_967:
        raise ConfigError(f"lock timeout is a number of seconds > 0 (or None for none), got {timeout!r}")
    return max(1, round(timeout * 1000))


@dataclass
class Outcome:
    """What ``suspend`` or ``wake`` did: the driver steps with their seconds, and what was found."""

    pid: int
    action: str
    state: ProcessState
    steps: list[tuple[str, float]] = field(default_factory=list)
    gpus: list[GpuUsage] | None = None
    mapping: GpuMapping | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(s for _, s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "action": self.action,
            "state": self.state.value,
            "steps": [{"step": n, "seconds": round(s, 6)} for n, s in self.steps],
            "seconds": round(self.seconds, 6),
            "gpus": None if self.gpus is None else [g.to_dict() for g in self.gpus],
            "mapping": None if self.mapping is None else {str(k): str(v) for k, v in self.mapping.items()},
            "warnings": self.warnings,
        }


class CudaProcess:
    """Another process's CUDA state, by PID. Nothing is asked of the process itself.

    ``gpus`` are the GPUs the process used (needed to check a GPU mapping); when not
    given they come from NVML at checkpoint time, or from ``suspend``'s record.
    ``driver`` defaults to the real one, loaded (and capability-checked) on first use.
    """

    def __init__(
        self,
        pid: int,
        *,
        driver: Driver | None = None,
        gpus: Sequence[GpuUsage | GpuUuid | str] | None = None,
        opened: Sequence[GpuUuid | str] = (),
    ) -> None:
        self.pid = check_pid(pid)
        self._driver = driver
        self.gpus: list[GpuUsage] | None = (
            None
            if gpus is None
            else [g if isinstance(g, GpuUsage) else GpuUsage(GpuUuid.parse(g), "", 0) for g in gpus]
        )
        self.opened = [GpuUuid.parse(g) for g in opened]

    @property
    def driver(self) -> Driver:
        if self._driver is None:
            self._driver = load_driver()
        return self._driver

    @property
    def state(self) -> ProcessState:
        require_alive(self.pid)
        return self.driver.get_state(self.pid)

    @property
    def restore_thread_id(self) -> int:
        """The driver's restore thread in the process (CRIU must leave it able to run)."""
        require_alive(self.pid)
        return self.driver.get_restore_thread_id(self.pid)

    def lock(self, timeout: float | None = None) -> None:
        """Block the process's further CUDA calls once its submitted work is done.

        ``timeout`` in seconds (None: wait as long as it takes); on timeout the process
        is left running.
        """
        ms = lock_timeout_ms(timeout)
        self._step("lock", lambda d: d.lock(self.pid, ms))

    def checkpoint(self) -> None:
        """Copy a locked process's GPU memory to host memory and release its GPUs."""
        if self.gpus is None:
            self._capture_gpus()
        self._step("checkpoint", lambda d: d.checkpoint(self.pid))

    def restore(self, gpu_mapping: MappingInput | None = None) -> None:
        """Bring a checkpointed process's GPU memory back, onto other GPUs if ``gpu_mapping`` says so.

        The mapping (old GPU to new, ``GPU-...`` or raw UUIDs) must name every GPU the
        process used; it is checked before the driver is called.
        """
        pairs = self.resolve_mapping(gpu_mapping)
        if pairs and not self.driver.info.can_remap:
            raise ProcessCheckpointError(
                f"restoring onto other GPUs needs driver r580 (CUDA 13.0) or "
                f"newer; this one supports CUDA {self.driver.info.cuda_version_text}: "
                "upgrade the driver, or wake the process on its own GPUs"
            )
        self._step("restore", lambda d: d.restore(self.pid, list(pairs.items())))

    def unlock(self) -> None:
        """Let a locked (or restored) process make CUDA calls again."""
        self._step("unlock", lambda d: d.unlock(self.pid))

    def resolve_mapping(self, gpu_mapping: MappingInput | None) -> GpuMapping:
        """The pairs the driver gets: empty when nothing moves, else one per GPU the process used."""
        mapping = normalize_mapping(gpu_mapping or {})
        if not mapping:
            return {}
        self._recall_gpus()
        full = complete_mapping(mapping, [g.uuid for g in self.gpus or []], self.opened)
        return {} if all(k == v for k, v in full.items()) else full

    def _step(self, op: str, call: Any) -> None:
        require_alive(self.pid)
        check_permission(self.pid)
        driver = self.driver
        check_transition(op, driver.get_state(self.pid), self.pid)
        call(driver)

    def _capture_gpus(self) -> None:
        """While the process still holds its GPUs (running or locked): which, through NVML."""
        try:
            self.gpus = nvml.process_usage(self.pid)
            self.opened = nvml.opened_gpus(self.pid)
        except nvml.NvmlUnavailable:
            pass  # keep what the caller gave, if anything

    def _recall_gpus(self) -> None:
        """Once checkpointed, the GPUs are only known from the suspend record."""
        if self.gpus is None:
            record = load_record(self.pid)
            if record is not None:
                self.gpus, self.opened = record.gpus, record.opened

    def suspend(self, timeout: float | None = None) -> Outcome:
        """Lock and checkpoint: the process is frozen and its GPU memory released."""
        lock_timeout_ms(timeout)  # a bad timeout is refused before anything happens
        require_alive(self.pid)
        report = preflight.scan_process(self.pid)
        report.raise_for_errors(f"suspending pid {self.pid}")
        out = Outcome(self.pid, "suspend", self.state, warnings=[f.message for f in report.warnings])
        steps = plan("suspend", out.state, self.pid)
        if "lock" in steps:
            out.steps.append(("lock", _timed(lambda: self.lock(timeout))))
        try:
            if steps:
                self._capture_gpus()
                if self.gpus is None:
                    out.warnings.append(
                        "NVML is unavailable: the GPUs this process used are not "
                        "recorded, so it can be woken only on the same GPUs"
                    )
                else:
                    gpu_report = preflight.scan_gpus(self.gpus, nvml.gpus())
                    out.warnings += [f.message for f in gpu_report.warnings]
                    gpu_report.raise_for_errors(f"suspending pid {self.pid}")
                out.steps.append(("checkpoint", _timed(self.checkpoint)))
        except BaseException:
            if "lock" in steps:
                self._unlock_after_failure()
            raise
        out.state = ProcessState.CHECKPOINTED
        if steps:
            record = SuspendRecord(
                self.pid, start_time(self.pid), self.gpus, self.opened, warnings=out.warnings
            )
            save_record(record)
        out.gpus = self.gpus
        return out

    def _unlock_after_failure(self) -> None:
        try:
            if self.driver.get_state(self.pid) == ProcessState.LOCKED:
                self.driver.unlock(self.pid)
        except ProcessCheckpointError:
            pass  # the original error says more; process-state shows where it was left

    def wake(self, gpu_mapping: MappingInput | None = None) -> Outcome:
        """Restore (onto other GPUs if mapped) and unlock: the process continues where it stopped."""
        require_alive(self.pid)
        self._recall_gpus()
        pairs = self.resolve_mapping(gpu_mapping)
        out = Outcome(self.pid, "wake", self.state, mapping=pairs or None, gpus=self.gpus)
        steps = plan("wake", out.state, self.pid)
        if gpu_mapping and "restore" not in steps:
            raise ConfigError(
                f"pid {self.pid} is {out.state.value}: its GPU memory is already restored, "
                "so --map cannot apply; wake it without --map"
            )
        if "restore" in steps and self.gpus:
            stay = {g: g for g in [u.uuid for u in self.gpus] + self.opened}
            report = preflight.check_restore_here(pairs or stay, self.gpus)
            out.warnings += [f.message for f in report.warnings]
            report.raise_for_errors(f"waking pid {self.pid}")
        if "restore" in steps:
            out.steps.append(("restore", _timed(lambda: self.restore(gpu_mapping))))
        if "unlock" in steps:
            out.steps.append(("unlock", _timed(self.unlock)))
        out.state = ProcessState.RUNNING
        drop_record(self.pid)
        return out


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
