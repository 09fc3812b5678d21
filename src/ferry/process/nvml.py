"""What NVML says about the GPUs: inventory, free memory, and which GPUs a process uses.

NVML (``nvidia-ml-py``) is optional. Without it, or without a driver, every function
raises ``NvmlUnavailable`` (a ``ProcessCheckpointError``) saying why; callers that can go
on without the information (preflight, ``ferry process state``) turn that into a warning.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import asdict, dataclass
from typing import Any

from ferry.errors import ProcessCheckpointError
from ferry.process.uuids import GpuUuid


class NvmlUnavailable(ProcessCheckpointError):
    """NVML cannot be used here; the message says why and what to install."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: GpuUuid
    name: str
    memory_total: int
    memory_free: int
    mig: bool
    """MIG mode is on: the driver cannot checkpoint processes on MIG instances."""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "uuid": str(self.uuid)}


@dataclass(frozen=True)
class GpuUsage:
    """One GPU a process holds a context on, and how much memory NVML charges it."""

    uuid: GpuUuid
    name: str
    used_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": str(self.uuid), "name": self.name, "used_bytes": self.used_bytes}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> GpuUsage:
        return cls(GpuUuid.parse(doc["uuid"]), str(doc["name"]), int(doc["used_bytes"]))


_lock = threading.Lock()
_module: Any = None


def _nvml() -> Any:
    """pynvml, initialized once per process."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        try:
            import pynvml
        except ImportError:
            raise NvmlUnavailable(
                "NVML bindings are not installed (nvidia-ml-py): pip install 'gpuferry[process]'"
            ) from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"NVML could not start ({exc}): it needs an NVIDIA driver "
                "(libnvidia-ml.so.1) and a GPU on this machine"
            ) from exc
        _module = pynvml
        return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def status() -> str | None:
    """None when NVML works here, else the reason it does not."""
    try:
        _nvml()
    except NvmlUnavailable as exc:
        return str(exc)
    return None


def driver_version() -> str:
    nv = _nvml()
    return _text(nv.nvmlSystemGetDriverVersion())


def gpus() -> list[GpuInfo]:
    nv = _nvml()
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        try:
            mig = bool(nv.nvmlDeviceGetMigMode(h)[0])
        except nv.NVMLError:  # not a MIG-capable GPU
            mig = False
        out.append(
            GpuInfo(
                i,
                GpuUuid.parse(_text(nv.nvmlDeviceGetUUID(h))),
                _text(nv.nvmlDeviceGetName(h)),
                int(mem.total),
                int(mem.free),
                mig,
            )
        )
    return out


def process_usage(pid: int) -> list[GpuUsage]:
    """The GPUs where ``pid`` has a compute context. Empty once its memory was checkpointed.

    NVML reports host PIDs: from inside a container with its own PID namespace a
    process is not found here; run ferry in the host's PID namespace.
    """
    nv = _nvml()
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        try:
            procs = list(nv.nvmlDeviceGetComputeRunningProcesses(h))
        except nv.NVMLError:
            continue
        used = [p for p in procs if int(p.pid) == pid]
        if used:
            total = sum(int(p.usedGpuMemory or 0) for p in used)  # None: not reported (e.g. in a VM)
            out.append(
                GpuUsage(GpuUuid.parse(_text(nv.nvmlDeviceGetUUID(h))), _text(nv.nvmlDeviceGetName(h)), total)
            )
    return out


def opened_gpus(pid: int) -> list[GpuUuid]:
    """The GPUs whose device files (``/dev/nvidiaN``) ``pid`` has open, by NVML's minor numbers.

    A CUDA process opens the GPUs its driver can see, not only those it allocates on;
    a restore with a GPU mapping has to place all of them. Empty once checkpointed.
    """
    minors = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                m = re.fullmatch(r"/dev/nvidia(\d+)", os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
            if m:
                minors.add(int(m.group(1)))
    except OSError:
        return []
    if not minors:
        return []
    nv = _nvml()
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        try:
            if int(nv.nvmlDeviceGetMinorNumber(h)) in minors:
                out.append(GpuUuid.parse(_text(nv.nvmlDeviceGetUUID(h))))
        except nv.NVMLError:
            continue
    return out
