"""``CudaProcess`` on real processes, up to the driver boundary.

Without a GPU every call that needs the driver must end in ferry's capability error,
and every check that can be made before the driver (PID, timeout, mapping, record)
must be made first. Only the last few tests use a stand-in driver, to walk the
successful paths (suspend, wake, rollback, remap) that need one.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from ferry.errors import ConfigError, ProcessCheckpointError
from ferry.process import CudaProcess, DriverCallError, DriverInfo, GpuUsage, GpuUuid, ProcessState
from ferry.process.pids import start_time
from ferry.process.record import SuspendRecord, load_record, save_record

A = "GPU-eea0d83f-ebcd-ac27-6b3e-bec2a19724e6"
B = "GPU-8f4022ba-e0cb-1298-286e-225c953a7feb"
C = "GPU-5449fdd5-fb83-f4ed-37a3-ea1057d82160"


def capability_error() -> str:
    """The first line of ferry's answer on this machine (no NVIDIA driver here)."""
    try:
        import cuda.bindings.driver  # noqa: F401
    except ImportError:
        return "process checkpoint needs the CUDA driver bindings"
    return "no NVIDIA driver on this machine (libcuda.so.1 could not be loaded)"


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_HOME", str(tmp_path / "home"))


@pytest.fixture
def sleeper() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _gpu_machine() -> bool:
    import ctypes.util

    return ctypes.util.find_library("cuda") is not None


needs_no_driver = pytest.mark.skipif(
    _gpu_machine(), reason="asserts the error of a machine without a GPU driver"
)


def test_dead_pid_fails_before_the_driver(dead_pid: int) -> None:
    p = CudaProcess(dead_pid)
    for call in (
        lambda: p.state,
        lambda: p.restore_thread_id,
        p.lock,
        p.checkpoint,
        p.unlock,
        p.suspend,
        p.wake,
    ):
        with pytest.raises(ProcessCheckpointError, match=f"no process with pid {dead_pid} on this machine"):
            call()


@needs_no_driver
def test_live_process_reaches_the_capability_check(sleeper: int) -> None:
    p = CudaProcess(sleeper)
    for call in (lambda: p.state, lambda: p.restore_thread_id, p.lock, p.checkpoint, p.restore, p.unlock):
        with pytest.raises(
            ProcessCheckpointError, match=r"^" + capability_error().replace("(", r"\(").replace(")", r"\)")
        ):
            call()
    with pytest.raises(ProcessCheckpointError, match=r"libcuda\.so\.1|cuda-bindings"):
        p.suspend(timeout=5)
    with pytest.raises(ProcessCheckpointError, match=r"libcuda\.so\.1|cuda-bindings"):
        p.wake()


def test_arguments_are_checked_before_the_driver(sleeper: int) -> None:
    with pytest.raises(ConfigError, match="a PID is a positive integer"):
        CudaProcess(0)
    p = CudaProcess(sleeper)
    with pytest.raises(ConfigError, match="lock timeout"):
        p.lock(timeout=-1)
    with pytest.raises(ConfigError, match="is not a GPU UUID"):
        p.restore({"0": "1"})
    with pytest.raises(ConfigError, match="does not know which GPUs the process used"):
        p.wake({A: B})


@needs_no_driver
def test_mapping_is_checked_against_the_suspend_record(sleeper: int) -> None:
    usage = [
        GpuUsage(GpuUuid.parse(A), "NVIDIA L4", 1 << 30),
        GpuUsage(GpuUuid.parse(B), "NVIDIA L4", 1 << 30),
    ]
    save_record(SuspendRecord(sleeper, start_time(sleeper), usage))
    p = CudaProcess(sleeper)
    with pytest.raises(ConfigError, match=f"missing {B}"):
        p.wake({A: C})
    with pytest.raises(ConfigError, match=f"names {C}, which the process did not use"):
        CudaProcess(sleeper).wake({A: B, B: A, C: C})
    with pytest.raises(ConfigError, match="are both mapped to"):
        CudaProcess(sleeper).wake({A: C, B: C})
    # a complete, one-to-one mapping passes every check and reaches the driver
    with pytest.raises(ProcessCheckpointError, match=r"libcuda\.so\.1|cuda-bindings"):
        CudaProcess(sleeper).wake({A: B, B: C})


# --- a stand-in driver, for the paths that need one to succeed --------------------------------


class StandInDriver:
    """Keeps each PID's state like the driver does and refuses what the driver refuses."""

    def __init__(self, can_remap: bool = True, fail: str | None = None) -> None:
        self.info = DriverInfo("test", 13000 if can_remap else 12080, can_remap)
        self.states: dict[int, ProcessState] = {}
        self.calls: list[tuple[object, ...]] = []
        self.fail = fail

    def _go(self, op: str, pid: int, before: ProcessState, after: ProcessState) -> None:
        self.calls.append((op, pid))
        if self.states.get(pid, ProcessState.RUNNING) != before:
            raise DriverCallError(op, pid, "CUDA_ERROR_ILLEGAL_STATE", "wrong state")
        if op == self.fail:
            raise DriverCallError(op, pid, "CUDA_ERROR_NOT_SUPPORTED", "stand-in failure")
        self.states[pid] = after

    def get_state(self, pid: int) -> ProcessState:
        return self.states.get(pid, ProcessState.RUNNING)

    def get_restore_thread_id(self, pid: int) -> int:
        return pid + 1

    def lock(self, pid: int, timeout_ms: int) -> None:
        self._go("lock", pid, ProcessState.RUNNING, ProcessState.LOCKED)
        self.calls[-1] += (timeout_ms,)

    def checkpoint(self, pid: int) -> None:
        self._go("checkpoint", pid, ProcessState.LOCKED, ProcessState.CHECKPOINTED)

    def restore(self, pid: int, pairs: Sequence[tuple[GpuUuid, GpuUuid]]) -> None:
        self._go("restore", pid, ProcessState.CHECKPOINTED, ProcessState.LOCKED)
        self.calls[-1] += (tuple((str(a), str(b)) for a, b in pairs),)

    def unlock(self, pid: int) -> None:
        self._go("unlock", pid, ProcessState.LOCKED, ProcessState.RUNNING)


def test_suspend_then_wake_walks_the_state_machine(sleeper: int) -> None:
    driver = StandInDriver()
    p = CudaProcess(sleeper, driver=driver)
    out = p.suspend(timeout=2.5)
    assert [s for s, _ in out.steps] == ["lock", "checkpoint"] and out.state == ProcessState.CHECKPOINTED
    assert driver.calls == [("lock", sleeper, 2500), ("checkpoint", sleeper)]
    assert p.state == ProcessState.CHECKPOINTED and p.restore_thread_id == sleeper + 1
    record = load_record(sleeper)
    assert record is not None and record.pid == sleeper
    if record.gpus is None:  # no NVML here: said, and recorded as unknown
        assert any("NVML is unavailable" in w for w in out.warnings)
    assert CudaProcess(sleeper, driver=driver).suspend().steps == []  # already suspended: nothing to do
    woken = CudaProcess(sleeper, driver=driver).wake()
    assert [s for s, _ in woken.steps] == ["restore", "unlock"] and woken.state == ProcessState.RUNNING
    assert driver.calls[2:] == [("restore", sleeper, ()), ("unlock", sleeper)]
    assert load_record(sleeper) is None
    assert CudaProcess(sleeper, driver=driver).wake().steps == []  # already running
    d = out.to_dict()
    assert d["state"] == "checkpointed" and [s["step"] for s in d["steps"]] == ["lock", "checkpoint"]


def test_a_failed_checkpoint_unlocks_the_process_again(sleeper: int) -> None:
    driver = StandInDriver(fail="checkpoint")
    with pytest.raises(DriverCallError, match=r"stand-in failure"):
        CudaProcess(sleeper, driver=driver).suspend()
    assert driver.states[sleeper] == ProcessState.RUNNING
    assert [c[0] for c in driver.calls] == ["lock", "checkpoint", "unlock"]
    assert load_record(sleeper) is None


def test_remap_sends_one_pair_per_used_gpu_and_needs_r580(sleeper: int) -> None:
    driver = StandInDriver()
    driver.states[sleeper] = ProcessState.CHECKPOINTED
    p = CudaProcess(sleeper, driver=driver, gpus=[B, A])
    p.wake({B: A, A: B})
    assert driver.calls[0] == ("restore", sleeper, ((B, A), (A, B)))  # whole, sorted by UUID
    driver.states[sleeper] = ProcessState.CHECKPOINTED
    CudaProcess(sleeper, driver=driver, gpus=[A], opened=[B]).wake({A: B})  # B, only opened, swaps
    assert driver.calls[-2] == ("restore", sleeper, ((B, A), (A, B)))
    driver.states[sleeper] = ProcessState.CHECKPOINTED
    CudaProcess(sleeper, driver=driver, gpus=[A, B]).wake({A: A, B: B})  # identity: no pairs
    assert driver.calls[-2] == ("restore", sleeper, ())
    old = StandInDriver(can_remap=False)
    old.states[sleeper] = ProcessState.CHECKPOINTED
    with pytest.raises(ProcessCheckpointError, match="needs driver r580"):
        CudaProcess(sleeper, driver=old, gpus=[A]).wake({A: C})
    assert old.calls == [] and old.states[sleeper] == ProcessState.CHECKPOINTED


def test_wake_of_a_locked_process_only_unlocks_and_refuses_a_map(sleeper: int) -> None:
    driver = StandInDriver()
    driver.states[sleeper] = ProcessState.LOCKED
    with pytest.raises(ConfigError, match="--map cannot apply"):
        CudaProcess(sleeper, driver=driver, gpus=[A]).wake({A: B})
    assert CudaProcess(sleeper, driver=driver).wake().steps[0][0] == "unlock"
    driver.states[sleeper] = ProcessState.FAILED
    with pytest.raises(ProcessCheckpointError, match="cannot be recovered"):
        CudaProcess(sleeper, driver=driver).wake()
    assert [c[0] for c in driver.calls] == ["unlock"]
