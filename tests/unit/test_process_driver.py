"""The capability check and the cuda-bindings boundary, for real on this machine.

Where ``cuda-bindings`` is installed but no NVIDIA driver is (this CI), ``load_driver``
must fail with ferry's message, never with the bindings' own exception; where the
bindings are missing, the message names the extra to install.
"""

from __future__ import annotations

import subprocess
import sys
import types
from typing import Any

import pytest

from ferry.errors import ProcessCheckpointError
from ferry.process.driver import (
    CHECKPOINT_SYMBOLS,
    INSTALL_HINT,
    MIN_DRIVER_CUDA,
    MIN_REMAP_DRIVER_CUDA,
    DriverCallError,
    DriverInfo,
    bindings_support_checkpoint,
    call_checked,
    check_permission,
    load_driver,
    restore_args,
)
from ferry.process.uuids import GpuUuid


def _have_bindings() -> bool:
    try:
        import cuda.bindings.driver  # noqa: F401
    except ImportError:
        return False
    return True


HAVE_BINDINGS = _have_bindings()


def _has_libcuda() -> bool:
    import ctypes.util

    return ctypes.util.find_library("cuda") is not None


NO_DRIVER = (
    "no NVIDIA driver on this machine (libcuda.so.1 could not be loaded): process checkpoint "
    "needs a Linux host with an NVIDIA GPU and driver r570 or newer"
)


@pytest.mark.skipif(not HAVE_BINDINGS, reason="cuda-bindings not installed (the `process` extra)")
@pytest.mark.skipif(_has_libcuda(), reason="this machine has an NVIDIA driver; the GPU tests cover it")
def test_capability_check_without_a_driver_gives_ferrys_error() -> None:
    with pytest.raises(ProcessCheckpointError) as err:
        load_driver()
    assert str(err.value) == NO_DRIVER
    assert isinstance(err.value.__cause__, RuntimeError)  # the bindings' own error, translated
    with pytest.raises(ProcessCheckpointError, match="no NVIDIA driver"):
        load_driver()  # a failed check is not cached as a success


def test_without_the_bindings_the_error_names_the_extra() -> None:
    # A real interpreter in which `import cuda` fails, as on a machine without the extra.
    code = (
        "import sys; sys.modules['cuda'] = None\n"
        "from ferry.process.driver import load_driver\n"
        "try:\n    load_driver()\nexcept Exception as e:\n    print(type(e).__name__, '|', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == (
        "ProcessCheckpointError | process checkpoint needs the CUDA driver bindings "
        f"(cuda-bindings >= 12.8): {INSTALL_HINT}"
    ), out.stderr
    assert INSTALL_HINT == "pip install 'gpuferry[process]'"


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("11.8.7", False),
        ("12.6.2", False),
        ("12.8.0", True),
        ("12.9.10", True),
        ("13.0.0", False),
        ("13.0.1", False),
        ("13.0.2", True),
        ("13.5.0", True),
        ("13.4.0b1", True),
        ("14.0", True),
    ],
)
def test_binding_versions_with_the_checkpoint_api(version: str, ok: bool) -> None:
    assert bindings_support_checkpoint(version) is ok


def test_driver_version_thresholds_are_r570_and_r580() -> None:
    assert (MIN_DRIVER_CUDA, MIN_REMAP_DRIVER_CUDA) == (12080, 13000)
    assert DriverInfo("13.5.0", 12080, False).cuda_version_text == "12.8"
    assert DriverInfo("13.5.0", 13020, True).cuda_version_text == "13.2"


@pytest.mark.skipif(not HAVE_BINDINGS, reason="cuda-bindings not installed (the `process` extra)")
def test_installed_bindings_have_every_checkpoint_symbol() -> None:
    from cuda.bindings import driver

    for name in (
        *CHECKPOINT_SYMBOLS,
        "CUcheckpointLockArgs",
        "CUcheckpointRestoreArgs",
    ):
        assert hasattr(driver, name), name
    states = {s.name for s in driver.CUprocessState}
    assert {
        "CU_PROCESS_STATE_RUNNING",
        "CU_PROCESS_STATE_LOCKED",
        "CU_PROCESS_STATE_CHECKPOINTED",
        "CU_PROCESS_STATE_FAILED",
    } <= states


@pytest.mark.skipif(not HAVE_BINDINGS, reason="cuda-bindings not installed (the `process` extra)")
def test_restore_args_carry_the_gpu_pairs_in_real_binding_structs() -> None:
    from cuda.bindings import driver

    a = GpuUuid.parse("GPU-eea0d83f-ebcd-ac27-6b3e-bec2a19724e6")
    b = GpuUuid.parse("GPU-8f4022ba-e0cb-1298-286e-225c953a7feb")
    if not hasattr(driver, "CUcheckpointGpuPair"):  # cuda-bindings 12.8: no remap on restore yet
        with pytest.raises(ProcessCheckpointError, match="cannot remap GPUs on restore"):
            restore_args(driver, [(a, b)])
        return
    args = restore_args(driver, [(a, b), (b, a)])
    assert isinstance(args, driver.CUcheckpointRestoreArgs)
    assert args.gpuPairsCount == 2
    got = [(p.oldUuid.bytes, p.newUuid.bytes) for p in args.gpuPairs]
    assert got == [(a.raw, b.raw), (b.raw, a.raw)]


@pytest.mark.skipif(not HAVE_BINDINGS, reason="cuda-bindings not installed (the `process` extra)")
def test_error_results_become_ferry_errors_with_a_hint() -> None:
    # The one stand-in here: a binding module whose functions return given CUresults
    # (the real enum), since no driver can be made to return them on demand.
    from cuda.bindings.driver import CUresult

    def module(result: Any = None, raises: Exception | None = None) -> Any:
        def func(pid: int, *args: Any) -> tuple[Any, ...]:
            if raises:
                raise raises
            return (result, 7)

        return types.SimpleNamespace(CUresult=CUresult, cuCheckpointProcessLock=func)

    assert call_checked(module(CUresult.CUDA_SUCCESS), "cuCheckpointProcessLock", 5) == (7,)
    with pytest.raises(DriverCallError, match="lock timed out") as err:
        call_checked(module(CUresult.CUDA_ERROR_NOT_READY), "cuCheckpointProcessLock", 5)
    assert (err.value.result, err.value.pid) == ("CUDA_ERROR_NOT_READY", 5)
    assert err.value.exit_code == 9
    with pytest.raises(DriverCallError, match="does not know this PID as a CUDA process"):
        call_checked(module(CUresult.CUDA_ERROR_INVALID_VALUE), "cuCheckpointProcessLock", 5)
    with pytest.raises(DriverCallError, match="NVIDIA/cuda-checkpoint#44"):
        call_checked(module(CUresult.CUDA_ERROR_OUT_OF_MEMORY), "cuCheckpointProcessLock", 5)
    missing = RuntimeError('Function "cuCheckpointProcessLock" not found')
    with pytest.raises(
        ProcessCheckpointError, match="has no cuCheckpointProcessLock: upgrade to driver r570"
    ):
        call_checked(module(raises=missing), "cuCheckpointProcessLock", 5)


def test_permission_check_on_real_processes() -> None:
    import os
    import shutil

    check_permission(os.getpid())  # our own process: always allowed
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to start a process as another user")
    # Another user's process, probed by a process without CAP_SYS_PTRACE: refused up front.
    other = subprocess.Popen(["sleep", "60"], user=65534, group=65534)
    try:
        code = (
            "from ferry.process.driver import check_permission\n"
            f"try:\n    check_permission({other.pid})\nexcept Exception as e:\n"
            "    print(type(e).__name__, '|', e)\n"
        )
        cmd = ["setpriv", "--bounding-set=-sys_ptrace", sys.executable, "-c", code]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == (
            f"ProcessCheckpointError | pid {other.pid} belongs to uid 65534, not to you (uid 0): "
            "run as root (with CAP_SYS_PTRACE) or as the process's owner"
        ), out.stderr
        check_permission(other.pid)  # with CAP_SYS_PTRACE (root here): allowed
    finally:
        other.kill()
        other.wait()
