"""Checks made before the driver is asked to do anything it could fail at half-way.

A failed restore can leave a process stuck for good (a restore that ran out of GPU
memory keeps failing after memory is freed, NVIDIA/cuda-checkpoint#44), so a remap is
checked first: same GPU model, enough free memory, no MIG. Before a suspend, the
process is scanned for what the driver cannot checkpoint, as far as that is visible
from outside it (``/proc/PID/maps`` and ``environ``). The pure checks take data, so
they are tested on any machine; the ``*_here`` helpers gather that data through NVML.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ferry.errors import ProcessCheckpointError
from ferry.process import nvml
from ferry.process.nvml import GpuInfo, GpuUsage
from ferry.process.uuids import GpuUuid

Level = Literal["error", "warning"]

MEMORY_HEADROOM = 64 * 1024**2
"""Free memory wanted on a target GPU beyond what NVML charged the process (context included)."""


@dataclass(frozen=True)
class Finding:
    level: Level
    code: str
    message: str


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)

    def add(self, level: Level, code: str, message: str) -> None:
        self.findings.append(Finding(level, code, message))

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]

    def raise_for_errors(self, what: str) -> None:
        if self.errors:
            raise ProcessCheckpointError(f"{what} refused: " + "; ".join(f.message for f in self.errors))

    def to_list(self) -> list[dict[str, Any]]:
        return [{"level": f.level, "code": f.code, "message": f.message} for f in self.findings]


def check_remap(
    mapping: Mapping[GpuUuid, GpuUuid], sources: Sequence[GpuUsage], targets: Sequence[GpuInfo]
) -> Report:
    """Each target exists here and is not in MIG mode; for each GPU the process held memory
    on (``sources``), the target is the same model and has room for that memory.

    The mapping itself was already checked to be one-to-one.
    """
    report = Report()
    by_uuid = {g.uuid: g for g in targets}
    src = {s.uuid: s for s in sources}
    for old, new in mapping.items():
        target = by_uuid.get(new)
        if target is None:
            report.add(
                "error",
                "target-missing",
                f"target GPU {new} is not on this machine "
                f"(it has {', '.join(str(g.uuid) for g in targets) or 'no GPU'})",
            )
            continue
        if target.mig:
            report.add("error", "mig", f"{new} is in MIG mode, which the driver cannot restore onto")
        source = src.get(old)
        if source is None:
            continue  # a GPU the process only opened: nothing of it to move
        if not source.name:
            report.add(
                "warning",
                "source-unknown",
                f"ferry has no record of the model and memory of "
                f"{old}; the model and free-memory checks for {new} were skipped",
            )
            continue
        if source.name != target.name:
            report.add(
                "error",
                "model-mismatch",
                f"{old} is a {source.name} but {new} is a {target.name}: "
                "the driver restores only onto the same GPU model; for another model use a "
                "framework-level checkpoint (ferry run)",
            )
        # Also on its own GPU: the suspended process released that memory and others may have taken it.
        need = source.used_bytes + MEMORY_HEADROOM
        if target.memory_free < need:
            report.add(
                "error",
                "memory",
                f"{new} has {target.memory_free / 1024**3:.2f} GiB free but "
                f"the process needs {need / 1024**3:.2f} GiB ({source.used_bytes / 1024**3:.2f} "
                "GiB it held plus headroom): free memory there first",
            )
    return report


def check_restore_here(mapping: Mapping[GpuUuid, GpuUuid], sources: Sequence[GpuUsage]) -> Report:
    """``check_remap`` against this machine's GPUs, as NVML sees them (a warning without NVML)."""
    try:
        targets = nvml.gpus()
    except nvml.NvmlUnavailable as exc:
        report = Report()
        report.add("warning", "no-nvml", f"GPU model and free memory not checked: {exc}")
        return report
    return check_remap(mapping, sources, targets)


# What a process has mapped or set that the driver cannot checkpoint. Each entry: a test
# on a /proc/PID/maps path, a finding code, and the message.
_MAP_SIGNS: tuple[tuple[str, str, str], ...] = (
    (
        "libnccl",
        "nccl",
        "NCCL is loaded: live NCCL communicators (CUDA IPC, P2P and network "
        "transports) cannot be checkpointed; destroy them first, or use a framework-level checkpoint",
    ),
    (
        "/dev/shm/nccl-",
        "ipc",
        "NCCL shared-memory segments are mapped: the process exchanges GPU "
        "data with other processes, which the driver cannot checkpoint",
    ),
    (
        "/dev/infiniband/",
        "rdma",
        "RDMA devices are mapped: registered GPU memory (GPUDirect RDMA) cannot be checkpointed",
    ),
    (
        "/dev/shm/torch_",
        "ipc",
        "torch.multiprocessing shared memory is mapped: CUDA tensors shared "
        "between processes go through CUDA IPC, which the driver cannot checkpoint",
    ),
)


def scan_process(pid: int) -> Report:
    """Warnings for features the driver cannot checkpoint, as far as /proc shows them.

    Not visible from outside: managed (UVM) allocations and CUDA IPC handles opened
    without NCCL or torch.multiprocessing. The driver refuses those at checkpoint time,
    and ``CudaProcess.suspend`` then unlocks the process again.
    """
    report = Report()
    if platform.machine() not in ("x86_64", "AMD64"):
        report.add(
            "error",
            "arch",
            f"the CUDA driver checkpoints x86_64 processes only, this is {platform.machine()}",
        )
    try:
        with open(f"/proc/{pid}/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    except OSError as exc:
        report.add("warning", "maps", f"cannot read /proc/{pid}/maps ({exc.strerror}): features not scanned")
        paths = set()
    seen: set[str] = set()
    for sign, code, message in _MAP_SIGNS:
        if message not in seen and any(sign in p for p in paths):
            seen.add(message)
            report.add("warning", code, message)
    env = _environ(pid)
    if env.get("CUDA_MPS_PIPE_DIRECTORY") or os.path.exists("/tmp/nvidia-mps/control"):
        report.add(
            "warning",
            "mps",
            "the process may run under MPS (an MPS control daemon or "
            "CUDA_MPS_PIPE_DIRECTORY was found), which the driver cannot checkpoint",
        )
    return report


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def scan_gpus(usage: Sequence[GpuUsage], inventory: Sequence[GpuInfo]) -> Report:
    """Errors for GPUs the driver cannot checkpoint on (MIG), a warning if the process holds none."""
    report = Report()
    if not usage:
        report.add(
            "warning",
            "no-context",
            "NVML shows no GPU context for this process: it may not "
            "use CUDA yet, or it runs in another PID namespace",
        )
    mig = {g.uuid for g in inventory if g.mig}
    for u in usage:
        if u.uuid in mig:
            report.add(
                "error",
                "mig",
                f"{u.uuid} is in MIG mode: the driver cannot checkpoint processes on MIG instances",
            )
    return report
