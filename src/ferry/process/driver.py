"""The driver boundary: a small ``Driver`` protocol and its implementation over ``cuda-bindings``.

Everything above this module (state machine, UUID checks, preflight, CLI) is plain
Python that runs anywhere; everything below it is the CUDA driver's checkpoint API
(``cuCheckpointProcess*``, driver r570 / CUDA 12.8 and newer; GPU remapping on restore
from r580 / CUDA 13.0). ``cuda-bindings`` is imported only when a driver is needed, and
every way of not having one (no package, no ``libcuda.so.1``, an old driver, a driver
without the symbols) becomes a ``ProcessCheckpointError`` that names the fix.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from ferry.errors import ProcessCheckpointError
from ferry.process.uuids import GpuUuid

INSTALL_HINT = "pip install 'gpuferry[process]'"
MIN_DRIVER_CUDA = 12080
"""cuDriverGetVersion of driver r570, the first with the cuCheckpointProcess* entry points."""
MIN_REMAP_DRIVER_CUDA = 13000
"""cuDriverGetVersion of driver r580: CUcheckpointRestoreArgs.gpuPairs (restore onto other GPUs)."""
CHECKPOINT_SYMBOLS = (
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessGetRestoreThreadId",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
)
_BINDING_TYPES = ("CUprocessState", "CUcheckpointLockArgs", "CUcheckpointRestoreArgs")


class ProcessState(str, Enum):
    """``CUprocessState``, by name. The last two exist only while custom storage is in use."""

    RUNNING = "running"
    LOCKED = "locked"
    CHECKPOINTED = "checkpointed"
    FAILED = "failed"
    CHECKPOINTING = "checkpointing"
    RESTORING = "restoring"


@dataclass(frozen=True)
class DriverInfo:
    bindings: str
    """Version of the cuda-bindings (or older cuda-python) package."""
    cuda_version: int
    """cuDriverGetVersion: 12080 for CUDA 12.8 (driver r570), 13000 for 13.0 (r580)."""
    can_remap: bool
    """Both the driver and the bindings support restoring onto other GPUs."""

    @property
    def cuda_version_text(self) -> str:
        return f"{self.cuda_version // 1000}.{self.cuda_version % 1000 // 10}"


class Driver(Protocol):
    """What ``CudaProcess`` needs from the CUDA driver, for another process by PID.

    ``load_driver()`` builds one after the capability check; ``CudaProcess`` calls
    ``get_state`` before each transition and then exactly one of ``lock`` (RUNNING to
    LOCKED), ``checkpoint`` (LOCKED to CHECKPOINTED), ``restore`` (CHECKPOINTED to
    LOCKED) or ``unlock`` (LOCKED to RUNNING). Failures raise ``DriverCallError``.
    """

    info: DriverInfo

    def get_state(self, pid: int) -> ProcessState: ...
    def get_restore_thread_id(self, pid: int) -> int: ...
    def lock(self, pid: int, timeout_ms: int) -> None: ...
    def checkpoint(self, pid: int) -> None: ...
    def restore(self, pid: int, pairs: Sequence[tuple[GpuUuid, GpuUuid]]) -> None: ...
    def unlock(self, pid: int) -> None: ...


class DriverCallError(ProcessCheckpointError):
    """A ``cuCheckpointProcess*`` call returned an error; ``result`` is its CUresult name."""

    def __init__(self, call: str, pid: int, result: str, hint: str) -> None:
        self.call, self.pid, self.result = call, pid, result
        super().__init__(f"{call}(pid {pid}) failed with {result}: {hint}")


# Why each CUresult happens for these calls, and what to do (the driver's own text is terse).
_HINTS: dict[str, str] = {
    "CUDA_ERROR_INVALID_VALUE": "the driver does not know this PID as a CUDA process (it has not "
    "initialized CUDA, has exited, or lives in another PID namespace), or an argument is invalid",
    "CUDA_ERROR_ILLEGAL_STATE": "the process is not in the state this step needs; check it with "
    "`ferry process state PID`",
    "CUDA_ERROR_NOT_SUPPORTED": "the driver cannot do this for this process (x86_64 Linux only; no UVM, "
    "IPC memory, MIG or MPS), or restoring onto other GPUs needs driver r580 or newer",
    "CUDA_ERROR_NOT_INITIALIZED": "cuInit failed in this process; check `nvidia-smi`",
    "CUDA_ERROR_NOT_READY": "the lock timed out: the process kept CUDA busy; retry with a longer "
    "timeout (the process was left running)",
    "CUDA_ERROR_TIMEOUT": "the lock timed out: the process kept CUDA busy; retry with a longer "
    "timeout (the process was left running)",
    "CUDA_ERROR_OUT_OF_MEMORY": "the target GPU lacks free memory for the process; the driver may "
    "not let a later restore succeed (NVIDIA/cuda-checkpoint#44), so free memory first",
    "CUDA_ERROR_OPERATING_SYSTEM": "an OS call failed; run as root, or as the process's owner with "
    "permission to ptrace it, and enable persistence mode (`nvidia-smi -pm 1`)",
    "CUDA_ERROR_NOT_PERMITTED": "run as root, or as the process's owner with permission to ptrace it",
    "CUDA_ERROR_INVALID_CONTEXT": "restore found no usable context; enable persistence mode "
    "(`nvidia-smi -pm 1`)",
}


def _import_bindings() -> tuple[Any, str]:
    try:
        import cuda.bindings as package
        from cuda.bindings import driver as module
    except ImportError:
        try:  # cuda-python < 12.6 spelled it cuda.cuda
            import cuda as package  # type: ignore[no-redef]
            from cuda import cuda as module  # type: ignore[attr-defined,no-redef]
        except ImportError:
            raise ProcessCheckpointError(
                f"process checkpoint needs the CUDA driver bindings (cuda-bindings >= 12.8): {INSTALL_HINT}"
            ) from None
    return module, str(getattr(package, "__version__", "0"))


def _version_tuple(text: str) -> tuple[int, int, int]:
    nums = [int(re.match(r"\d*", p).group() or 0) for p in text.split(".")[:3]]  # type: ignore[union-attr]
    nums += [0] * (3 - len(nums))
    return nums[0], nums[1], nums[2]


def bindings_support_checkpoint(version: str) -> bool:
    """cuda-bindings gained the checkpoint entry points in 12.8.0, and in the 13 line in 13.0.2."""
    v = _version_tuple(version)
    return (12, 8, 0) <= v < (13, 0, 0) or v >= (13, 0, 2)


def result_name(result: Any) -> str:
    name = getattr(result, "name", None)
    return str(name) if name else f"CUresult {int(result)}"


class CudaBindingsDriver:
    """``Driver`` over ``cuda.bindings.driver``: each call returns ``(CUresult, *values)``."""

    def __init__(self, cu: Any, info: DriverInfo) -> None:
        self._cu = cu
        self.info = info
        self._states = {
            getattr(cu.CUprocessState, f"CU_PROCESS_STATE_{s.name}"): s
            for s in ProcessState
            if hasattr(cu.CUprocessState, f"CU_PROCESS_STATE_{s.name}")
        }

    def _call(self, name: str, pid: int, *args: Any) -> tuple[Any, ...]:
        return call_checked(self._cu, name, pid, *args)

    def get_state(self, pid: int) -> ProcessState:
        (state,) = self._call("cuCheckpointProcessGetState", pid)
        if state not in self._states:
            raise ProcessCheckpointError(
                f"the driver reports an unknown state {state!r} for pid {pid}; upgrade ferry"
            )
        return self._states[state]

    def get_restore_thread_id(self, pid: int) -> int:
        (tid,) = self._call("cuCheckpointProcessGetRestoreThreadId", pid)
        return int(tid)

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = self._cu.CUcheckpointLockArgs()
        args.timeoutMs = timeout_ms
        self._call("cuCheckpointProcessLock", pid, args)

    def checkpoint(self, pid: int) -> None:
        self._call("cuCheckpointProcessCheckpoint", pid, None)

    def restore(self, pid: int, pairs: Sequence[tuple[GpuUuid, GpuUuid]]) -> None:
        args = restore_args(self._cu, pairs) if pairs else None
        self._call("cuCheckpointProcessRestore", pid, args)

    def unlock(self, pid: int) -> None:
        self._call("cuCheckpointProcessUnlock", pid, None)


def call_checked(cu: Any, name: str, pid: int, *args: Any) -> tuple[Any, ...]:
    """Call ``cu.<name>(pid, *args)``; turn a missing symbol or an error CUresult into ferry's errors."""
    func: Callable[..., Any] = getattr(cu, name)
    try:
        result = func(pid, *args)
    except RuntimeError as exc:
        if name in str(exc):  # cuda-bindings: 'Function "cu..." not found' on drivers before r570
            raise ProcessCheckpointError(
                f"the installed NVIDIA driver has no {name}: upgrade to driver r570 or newer ({exc})"
            ) from exc
        raise ProcessCheckpointError(f"could not call {name} ({exc}): is the NVIDIA driver loaded?") from exc
    result = result if isinstance(result, tuple) else (result,)
    err, values = result[0], result[1:]
    if err != cu.CUresult.CUDA_SUCCESS:
        name_ = result_name(err)
        raise DriverCallError(name, pid, name_, _HINTS.get(name_, "see the CUDA driver API documentation"))
    return tuple(values)


def restore_args(cu: Any, pairs: Sequence[tuple[GpuUuid, GpuUuid]]) -> Any:
    """A ``CUcheckpointRestoreArgs`` whose ``gpuPairs`` remap each old GPU onto a new one."""
    if not hasattr(cu, "CUcheckpointGpuPair"):
        raise ProcessCheckpointError(
            f"these cuda-bindings cannot remap GPUs on restore (no "
            f"CUcheckpointGpuPair): upgrade them, {INSTALL_HINT}"
        )
    out = []
    for old, new in pairs:
        pair = cu.CUcheckpointGpuPair()
        pair.oldUuid, pair.newUuid = _cuuuid(cu, old), _cuuuid(cu, new)
        out.append(pair)
    args = cu.CUcheckpointRestoreArgs()
    args.gpuPairs = out
    args.gpuPairsCount = len(out)
    return args


def _cuuuid(cu: Any, uuid: GpuUuid) -> Any:
    # CUuuid.bytes is read-only in cuda-bindings; write the 16 bytes through its address.
    value = cu.CUuuid()
    ctypes.memmove(value.getPtr(), uuid.raw, 16)
    return value


def _probe_driver(cu: Any, bindings: str) -> DriverInfo:
    """cuInit, the driver's CUDA version, and the checkpoint symbols; each failure says what to do."""
    try:
        (err,) = cu.cuInit(0)
    except RuntimeError as exc:  # cuda.pathfinder: libcuda.so.1 not found
        raise ProcessCheckpointError(
            "no NVIDIA driver on this machine (libcuda.so.1 could not be loaded): process checkpoint "
            "needs a Linux host with an NVIDIA GPU and driver r570 or newer"
        ) from exc
    if err != cu.CUresult.CUDA_SUCCESS:
        raise ProcessCheckpointError(
            f"cuInit failed with {result_name(err)}: check that `nvidia-smi` "
            "sees a GPU and that /dev/nvidia* are accessible"
        )
    err, version = cu.cuDriverGetVersion()
    if err != cu.CUresult.CUDA_SUCCESS:
        raise ProcessCheckpointError(f"cuDriverGetVersion failed with {result_name(err)}")
    info = DriverInfo(
        bindings, int(version), int(version) >= MIN_REMAP_DRIVER_CUDA and hasattr(cu, "CUcheckpointGpuPair")
    )
    if info.cuda_version < MIN_DRIVER_CUDA:
        raise ProcessCheckpointError(
            f"the NVIDIA driver supports CUDA {info.cuda_version_text}; process "
            "checkpoint needs driver r570 (CUDA 12.8) or newer, r580 to move "
            "to another GPU: upgrade the driver"
        )
    missing = []
    for symbol in CHECKPOINT_SYMBOLS:
        err, ptr, _ = cu.cuGetProcAddress(symbol.encode(), MIN_DRIVER_CUDA, 0)
        if err != cu.CUresult.CUDA_SUCCESS or not ptr:
            missing.append(symbol)
    if missing:
        raise ProcessCheckpointError(
            f"the NVIDIA driver (CUDA {info.cuda_version_text}) lacks "
            f"{', '.join(missing)}: upgrade to driver r570 or newer"
        )
    return info


@functools.cache
def load_driver() -> Driver:
    """The real driver, after the capability check (cached once it passes; failures are not)."""
    cu, bindings = _import_bindings()
    problems = []
    if not bindings_support_checkpoint(bindings):
        problems.append(f"cuda-bindings {bindings} predates the checkpoint API (needs 12.8+ or 13.0.2+)")
    lacking = [s for s in CHECKPOINT_SYMBOLS + _BINDING_TYPES if not hasattr(cu, s)]
    if lacking:
        problems.append(f"cuda-bindings {bindings} has no {', '.join(lacking)}")
    if problems:
        raise ProcessCheckpointError(f"{'; '.join(problems)}: upgrade them, {INSTALL_HINT}")
    return CudaBindingsDriver(cu, _probe_driver(cu, bindings))


# --- permissions -----------------------------------------------------------------------------

CAP_SYS_PTRACE = 19


def _status_field(pid: int | str, field: str) -> str | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def check_permission(pid: int) -> None:
    """Controlling another process's CUDA state is a ptrace-level privilege: refuse early if we lack it.

    Root (or CAP_SYS_PTRACE) may control any process; another user only their own, and under
    Yama ``ptrace_scope`` >= 2 only with CAP_SYS_PTRACE.
    """
    caps = int(_status_field("self", "CapEff") or "0", 16)
    if caps & (1 << CAP_SYS_PTRACE):
        return
    uid_line = _status_field(pid, "Uid")
    if uid_line is None:
        raise ProcessCheckpointError(f"no process with pid {pid} (or /proc/{pid} is not readable)")
    owner = int(uid_line.split()[0])
    if owner != os.geteuid():
        raise ProcessCheckpointError(
            f"pid {pid} belongs to uid {owner}, not to you (uid {os.geteuid()}): "
            "run as root (with CAP_SYS_PTRACE) or as the process's owner"
        )
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read().strip() or 0)
    except (OSError, ValueError):
        scope = 0
    if scope >= 2:
        raise ProcessCheckpointError(
            f"kernel.yama.ptrace_scope is {scope}: controlling pid {pid} needs CAP_SYS_PTRACE; run as root"
        )
