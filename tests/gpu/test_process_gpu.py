"""Process-level checkpoint of a real PyTorch CUDA training process (needs a GPU).

The child (``train_child.py``) trains without knowing about ferry. It is suspended
mid-run; NVML must show its GPU memory released and the process must make no progress;
it is woken and must finish with losses and parameters bitwise equal to a run that
was never interrupted, and with its untouched GPU ballast unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from gpuneeds import FERRY, why_no_process_checkpoint

from ferry.process import CudaProcess, ProcessState, load_driver, nvml

pytestmark = pytest.mark.gpu
CHILD = Path(__file__).with_name("train_child.py")
STEPS = 400
BALLAST_MB = 512


class Child:
    """The training child, with a thread that follows its ``step N`` lines."""

    def __init__(self, out: Path, env: dict[str, str] | None = None) -> None:
        cmd = [sys.executable, str(CHILD), str(out), "--steps", str(STEPS), "--ballast-mb", str(BALLAST_MB)]
        self.out = out
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        self.step = 0
        self.ready = threading.Event()
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("ready"):
                self.ready.set()
            elif line.startswith("step "):
                self.step = int(line.split()[1])

    def wait_step(self, n: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.step < n:
            assert self.proc.poll() is None, f"child exited with {self.proc.returncode}"
            assert time.monotonic() < deadline, f"child did not reach step {n}"
            time.sleep(0.01)

    def result(self, timeout: float = 300.0) -> dict[str, Any]:
        assert self.proc.wait(timeout=timeout) == 0
        return dict(json.loads(self.out.read_text()))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(autouse=True, scope="module")
def _require_process_checkpoint() -> None:
    """Before ``reference`` (module fixtures that are autouse come first): no child is run for
    nothing where the driver's checkpoint API or NVML is missing."""
    reason = why_no_process_checkpoint()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The run nobody interrupted."""
    child = Child(tmp_path_factory.mktemp("ref") / "ref.json")
    try:
        return child.result()
    finally:
        child.kill()


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_HOME", str(tmp_path / "home"))


def free_bytes(uuid: object) -> int:
    return next(g.memory_free for g in nvml.gpus() if g.uuid == uuid)


def test_suspend_releases_the_gpu_and_wake_resumes_bitwise(tmp_path: Path, reference: dict[str, Any]) -> None:
    assert reference["ballast_before"] == reference["ballast_after"]
    child = Child(tmp_path / "run.json")
    try:
        child.wait_step(STEPS // 4)
        process = CudaProcess(child.proc.pid)
        held = nvml.process_usage(child.proc.pid)
        assert len(held) == 1 and held[0].used_bytes >= BALLAST_MB * 2**20
        free_before = free_bytes(held[0].uuid)

        out = process.suspend(timeout=30)
        assert [s for s, _ in out.steps] == ["lock", "checkpoint"]
        assert process.state == ProcessState.CHECKPOINTED
        assert nvml.process_usage(child.proc.pid) == []  # no context left on any GPU
        released = free_bytes(held[0].uuid) - free_before
        assert released >= 0.9 * held[0].used_bytes, (released, held[0].used_bytes)
        frozen_at = child.step
        time.sleep(1.5)
        assert child.step <= frozen_at + 1  # at most the step already past its last CUDA call
        assert child.proc.poll() is None

        woken = process.wake()
        assert woken.state == ProcessState.RUNNING and process.state == ProcessState.RUNNING
        assert nvml.process_usage(child.proc.pid)[0].uuid == held[0].uuid
        result = child.result()
    finally:
        child.kill()
    assert frozen_at < STEPS
    assert result == reference  # every loss, the parameters and the ballast, bitwise


def test_the_cli_suspends_and_wakes_a_training_process(tmp_path: Path, reference: dict[str, Any]) -> None:
    child = Child(tmp_path / "run.json")
    env = {**os.environ, "FERRY_HOME": str(tmp_path / "home")}

    def ferry(*args: str) -> dict[str, Any]:
        out = subprocess.run([*FERRY, *args, "--json"], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout))

    try:
        child.wait_step(STEPS // 3)
        pid = str(child.proc.pid)
        suspended = ferry("process", "suspend", pid)
        assert suspended["state"] == "checkpointed" and suspended["gpus"]
        state = ferry("process", "state", pid)
        assert state["state"] == "checkpointed" and state["gpus"] == []
        assert state["suspend_record"]["gpus"] == suspended["gpus"]
        assert ferry("process", "suspend", pid)["steps"] == []  # already suspended
        woken = ferry("process", "wake", pid)
        assert woken["state"] == "running" and [s["step"] for s in woken["steps"]] == ["restore", "unlock"]
        result = child.result()
    finally:
        child.kill()
    assert result == reference


def _same_model_pair() -> tuple[int, str] | None:
    gpus = nvml.gpus()
    for g in gpus:
        if sum(1 for h in gpus if h.name == g.name and not h.mig) >= 2:
            return g.index, g.name
    return None


def test_wake_onto_another_gpu_of_the_same_model(tmp_path: Path, reference: dict[str, Any]) -> None:
    pair = _same_model_pair()
    if pair is None:
        pytest.skip("needs two GPUs of the same model")
    if not load_driver().info.can_remap:
        pytest.skip(f"driver supports CUDA {load_driver().info.cuda_version_text}; remapping needs r580+")
    index, name = pair
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(index)}
    child = Child(tmp_path / "run.json", env=env)
    try:
        child.wait_step(STEPS // 4)
        (src,) = nvml.process_usage(child.proc.pid)
        dst = next(g.uuid for g in nvml.gpus() if g.name == name and g.uuid != src.uuid and not g.mig)
        process = CudaProcess(child.proc.pid)
        process.suspend(timeout=30)
        woken = process.wake({str(src.uuid): str(dst)})
        assert woken.mapping is not None and woken.mapping[src.uuid] == dst
        assert [g.uuid for g in nvml.process_usage(child.proc.pid)] == [dst]
        result = child.result()
    finally:
        child.kill()
    assert result == reference  # same model, deterministic kernels: bitwise the same run
