"""The driver's state machine as ferry enforces it, and the suspend record, on real PIDs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from ferry.errors import ConfigError, ProcessCheckpointError
from ferry.process.cuda import lock_timeout_ms
from ferry.process.driver import ProcessState as S
from ferry.process.nvml import GpuUsage
from ferry.process.pids import check_pid, require_alive, start_time
from ferry.process.record import SuspendRecord, drop_record, load_record, record_path, save_record
from ferry.process.states import PLANS, TRANSITIONS, check_transition, plan
from ferry.process.uuids import GpuUuid

GPU = GpuUuid.parse("GPU-eea0d83f-ebcd-ac27-6b3e-bec2a19724e6")


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


# Every (operation, state) pair: allowed exactly when the driver documents it.
ALLOWED = {("lock", S.RUNNING), ("checkpoint", S.LOCKED), ("restore", S.CHECKPOINTED), ("unlock", S.LOCKED)}


@pytest.mark.parametrize("op", list(TRANSITIONS))
@pytest.mark.parametrize("state", [S.RUNNING, S.LOCKED, S.CHECKPOINTED])
def test_what_may_follow_what(op: str, state: S) -> None:
    if (op, state) in ALLOWED:
        check_transition(op, state, 42)
        return
    with pytest.raises(ProcessCheckpointError, match=f"cannot {op} pid 42: it is {state.value}"):
        check_transition(op, state, 42)


def test_refusals_say_what_to_do() -> None:
    with pytest.raises(ProcessCheckpointError, match="lock it first"):
        check_transition("checkpoint", S.RUNNING, 1)
    with pytest.raises(ProcessCheckpointError, match="restore it first"):
        check_transition("unlock", S.CHECKPOINTED, 1)
    with pytest.raises(ProcessCheckpointError, match="wake it"):
        check_transition("lock", S.CHECKPOINTED, 1)
    with pytest.raises(ConfigError, match="unknown operation 'freeze'"):
        check_transition("freeze", S.RUNNING, 1)


@pytest.mark.parametrize("op", [*TRANSITIONS, "suspend", "wake"])
def test_failed_is_terminal_and_transient_states_say_retry(op: str) -> None:
    check = (lambda s: plan(op, s, 7)) if op in PLANS else (lambda s: check_transition(op, s, 7))
    with pytest.raises(ProcessCheckpointError, match="cannot be recovered"):
        check(S.FAILED)
    for busy in (S.CHECKPOINTING, S.RESTORING):
        with pytest.raises(ProcessCheckpointError, match="wait and retry"):
            check(busy)


def test_suspend_and_wake_plans_walk_the_transitions() -> None:
    assert plan("suspend", S.RUNNING, 1) == ("lock", "checkpoint")
    assert plan("suspend", S.LOCKED, 1) == ("checkpoint",)
    assert plan("suspend", S.CHECKPOINTED, 1) == ()
    assert plan("wake", S.CHECKPOINTED, 1) == ("restore", "unlock")
    assert plan("wake", S.LOCKED, 1) == ("unlock",)
    assert plan("wake", S.RUNNING, 1) == ()
    # each plan is a chain of allowed transitions ending in the action's goal
    for action, goal in (("suspend", S.CHECKPOINTED), ("wake", S.RUNNING)):
        for start, steps in PLANS[action].items():
            state = start
            for step in steps:
                check_transition(step, state, 1)
                state = TRANSITIONS[step][1]
            assert state == goal


@pytest.mark.parametrize("pid", [0, -1, True, "12", 1.0, None])
def test_pid_must_be_a_positive_int(pid: object) -> None:
    with pytest.raises(ConfigError, match="a PID is a positive integer"):
        check_pid(pid)


def test_lock_timeout_seconds_to_driver_milliseconds() -> None:
    assert lock_timeout_ms(None) == 0  # the driver's "no timeout"
    assert lock_timeout_ms(2.5) == 2500
    assert lock_timeout_ms(0.0001) == 1  # never rounds down to "no timeout"
    for bad in (0, -1, float("nan"), True, "5", 5_000_000):
        with pytest.raises(ConfigError, match="lock timeout is a number of seconds"):
            lock_timeout_ms(bad)  # type: ignore[arg-type]


def test_dead_pid_is_refused(sleeper: subprocess.Popen[bytes]) -> None:
    require_alive(sleeper.pid)
    assert start_time(sleeper.pid) is not None
    sleeper.kill()
    sleeper.wait()
    with pytest.raises(ProcessCheckpointError, match=f"no process with pid {sleeper.pid}"):
        require_alive(sleeper.pid)


def test_record_round_trips_and_ignores_a_reused_pid(
    sleeper: subprocess.Popen[bytes], tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FERRY_HOME", str(tmp_path))
    pid = sleeper.pid
    assert load_record(pid) is None
    usage = [GpuUsage(GPU, "NVIDIA H100 80GB HBM3", 3 << 30)]
    other = GpuUuid.parse("GPU-8f4022ba-e0cb-1298-286e-225c953a7feb")
    rec = SuspendRecord(pid, start_time(pid), usage, [GPU, other], warnings=["w"])
    path = save_record(rec)
    assert path == record_path(pid) == os.path.join(str(tmp_path), "process", f"{pid}.json")
    loaded = load_record(pid)
    assert loaded is not None and loaded.gpus == rec.gpus and loaded.warnings == ["w"]
    assert loaded.opened == [GPU, other]
    # the same PID number for another process (another start time) is not this record's process
    save_record(SuspendRecord(pid, (start_time(pid) or 0) + 1, None))
    assert load_record(pid) is None
    drop_record(pid)
    drop_record(pid)  # idempotent
    assert not os.path.exists(path)
