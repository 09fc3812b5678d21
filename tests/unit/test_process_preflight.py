"""Preflight: remap checks on GPU inventories, and feature scans of real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.errors import ProcessCheckpointError
from ferry.process import nvml
from ferry.process.nvml import GpuInfo, GpuUsage
from ferry.process.preflight import (
    MEMORY_HEADROOM,
    Report,
    check_remap,
    check_restore_here,
    scan_gpus,
    scan_process,
)
from ferry.process.uuids import GpuUuid

A, B, C, D = (
    GpuUuid.parse(u)
    for u in (
        "GPU-eea0d83f-ebcd-ac27-6b3e-bec2a19724e6",
        "GPU-8f4022ba-e0cb-1298-286e-225c953a7feb",
        "GPU-5449fdd5-fb83-f4ed-37a3-ea1057d82160",
        "GPU-6fbeda44-9d0c-67a9-1dd4-44a22fb5ff2c",
    )
)
GiB = 1024**3
HOST = [
    GpuInfo(0, A, "NVIDIA L4", 24 * GiB, 23 * GiB, False),
    GpuInfo(1, B, "NVIDIA L4", 24 * GiB, 2 * GiB, False),
    GpuInfo(2, C, "NVIDIA H100 80GB HBM3", 80 * GiB, 79 * GiB, False),
    GpuInfo(3, D, "NVIDIA L4", 24 * GiB, 23 * GiB, True),
]


def codes(report: Report) -> list[tuple[str, str]]:
    return [(f.level, f.code) for f in report.findings]


def test_same_model_with_room_passes() -> None:
    used = [GpuUsage(B, "NVIDIA L4", 10 * GiB)]
    assert codes(check_remap({B: A}, used, HOST)) == []


def test_other_model_missing_target_mig_and_full_gpu_are_errors() -> None:
    used = [GpuUsage(A, "NVIDIA L4", 10 * GiB)]
    r = check_remap({A: C}, used, HOST)
    assert codes(r) == [("error", "model-mismatch")]
    assert "is a NVIDIA L4 but" in r.errors[0].message and "framework-level checkpoint" in r.errors[0].message
    assert codes(check_remap({A: D}, used, HOST)) == [("error", "mig")]
    missing = GpuUuid(b"\x01" * 16)
    assert codes(check_remap({A: missing}, used, HOST)) == [("error", "target-missing")]
    r = check_remap({A: B}, used, HOST)
    assert codes(r) == [("error", "memory")]
    assert "has 2.00 GiB free but the process needs 10.06 GiB" in r.errors[0].message
    with pytest.raises(ProcessCheckpointError, match=r"^waking pid 5 refused: .* has 2\.00 GiB free"):
        r.raise_for_errors("waking pid 5")


def test_staying_on_the_same_gpu_still_needs_its_memory_back() -> None:
    # While suspended, another job may have taken the memory; a restore that runs out of it
    # can leave the process unrecoverable, so this is checked, not left to the driver.
    assert codes(check_remap({B: B}, [GpuUsage(B, "NVIDIA L4", 1 * GiB)], HOST)) == []
    assert codes(check_remap({B: B}, [GpuUsage(B, "NVIDIA L4", 2 * GiB)], HOST)) == [("error", "memory")]
    exact = 2 * GiB - MEMORY_HEADROOM
    assert codes(check_remap({B: B}, [GpuUsage(B, "NVIDIA L4", exact)], HOST)) == []


def test_unknown_source_is_a_warning_not_a_guess() -> None:
    r = check_remap({A: B}, [GpuUsage(A, "", 0)], HOST)
    assert codes(r) == [("warning", "source-unknown")]
    assert r.errors == [] and r.warnings[0].code == "source-unknown"


def test_nvml_says_why_it_is_unavailable() -> None:
    reason = nvml.status()
    if reason is None:
        pytest.skip("NVML works on this machine")
    try:
        import pynvml  # noqa: F401

        have_pynvml = True
    except ImportError:
        have_pynvml = False
    if not have_pynvml:
        assert reason == "NVML bindings are not installed (nvidia-ml-py): pip install 'gpuferry[process]'"
    else:
        assert reason == (
            "NVML could not start (NVML Shared Library Not Found): it needs an NVIDIA driver "
            "(libnvidia-ml.so.1) and a GPU on this machine"
        )
    for call in (nvml.gpus, nvml.driver_version, lambda: nvml.process_usage(os.getpid())):
        with pytest.raises(nvml.NvmlUnavailable, match="NVML"):
            call()
    r = check_restore_here({A: B}, [GpuUsage(A, "NVIDIA L4", GiB)])
    assert codes(r) == [("warning", "no-nvml")] and reason in r.warnings[0].message


def test_gpu_scan_flags_mig_and_no_context() -> None:
    assert codes(scan_gpus([], HOST)) == [("warning", "no-context")]
    assert codes(scan_gpus([GpuUsage(D, "NVIDIA L4", GiB)], HOST)) == [("error", "mig")]
    assert codes(scan_gpus([GpuUsage(A, "NVIDIA L4", GiB)], HOST)) == []


MAPPER = """
import mmap, sys, time
maps = []
for path in sys.argv[1:]:
    f = open(path, "r+b")
    maps.append(mmap.mmap(f.fileno(), 4096))
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def mapped_child(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A real process that maps a library named like NCCL's and a torch shared-memory segment."""
    lib = tmp_path / "libnccl.so.2"
    shm = Path(f"/dev/shm/torch_ferrytest_{os.getpid()}") if os.path.isdir("/dev/shm") else tmp_path / "x"
    for p in (lib, shm):
        p.write_bytes(b"\0" * 4096)
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps"}
    proc = subprocess.Popen(
        [sys.executable, "-c", MAPPER, str(lib), str(shm)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait()
    shm.unlink()


def test_scan_finds_nccl_ipc_and_mps_in_a_real_process(mapped_child: subprocess.Popen[str]) -> None:
    r = scan_process(mapped_child.pid)
    found = codes(r)
    assert ("warning", "nccl") in found and ("warning", "mps") in found
    if os.path.isdir("/dev/shm"):
        assert ("warning", "ipc") in found
    assert r.errors == []
    assert "destroy them first" in next(f.message for f in r.findings if f.code == "nccl")


def test_scan_of_a_plain_process_is_clean_and_of_a_dead_one_says_so() -> None:
    proc = subprocess.Popen(["sleep", "30"], env={"PATH": os.environ.get("PATH", "")})
    try:
        assert scan_process(proc.pid).findings == [] or os.path.exists("/tmp/nvidia-mps/control")
    finally:
        proc.kill()
        proc.wait()
    r = scan_process(proc.pid)
    assert codes(r) == [("warning", "maps")] and "features not scanned" in r.warnings[0].message
