"""The CRIU adapter with whatever CRIU this machine has (Debian 12 ships 3.17, without the CUDA plugin).

Where ``criu check`` passes, a real process that counts in memory is dumped and restored
and must continue its count; where it fails (as in many sandboxes), the adapter's error
is asserted and the dump is skipped with CRIU's reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.errors import ConfigError, ProcessCheckpointError
from ferry.process import criu

COUNTER = """
import os, sys, time
path, n = sys.argv[1], 0
while True:
    n += 1
    with open(path + ".tmp", "w") as f:
        f.write(str(n))
    os.replace(path + ".tmp", path)
    time.sleep(0.02)
"""


@pytest.fixture
def sleeper() -> Iterator[int]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


def installed() -> bool:
    try:
        criu.find_criu()
    except ProcessCheckpointError:
        return False
    return True


def test_find_criu_reports_version_or_what_to_install() -> None:
    if not installed():
        with pytest.raises(
            ProcessCheckpointError, match=r"^criu is not installed \(not on PATH\): install CRIU"
        ):
            criu.find_criu()
        return
    info = criu.find_criu()
    assert os.path.isabs(info.path) and info.version >= (3,)
    assert info.plugin_dir == os.environ.get("CRIU_LIBS_DIR", "/usr/lib/criu")


def test_a_process_without_gpu_needs_no_cuda_plugin(sleeper: int) -> None:
    assert criu.uses_gpu(sleeper) is False
    assert criu.uses_gpu(999_999_999) is False


@pytest.mark.skipif(os.geteuid() != 0, reason="the GPU requirements are checked after the root check")
def test_gpu_requirements_name_every_missing_piece(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not installed():
        with pytest.raises(ProcessCheckpointError, match="criu is not installed"):
            criu.requirements(gpu=True)
        return
    info = criu.find_criu()
    monkeypatch.setenv("CRIU_LIBS_DIR", str(tmp_path))  # an empty plugin folder: no cuda_plugin.so
    if info.version < criu.MIN_GPU_CRIU:
        with pytest.raises(ProcessCheckpointError) as err:
            criu.requirements(gpu=True)
        msg = str(err.value)
        assert msg.startswith("CRIU cannot checkpoint this GPU process: ")
        assert f"criu {info.version_text} is too old for GPU processes: install CRIU 4.0 or newer" in msg
        assert f"CRIU's CUDA plugin (cuda_plugin.so) is not in {tmp_path}" in msg
    (tmp_path / "cuda_plugin.so").write_bytes(b"")
    assert criu.find_criu().cuda_plugin == str(tmp_path / "cuda_plugin.so")


def test_folders_are_checked_before_criu_runs(sleeper: int, tmp_path: Path) -> None:
    (tmp_path / "inventory.img").write_bytes(b"")
    with pytest.raises(ConfigError, match="already holds a CRIU dump: use an empty folder"):
        criu.dump(sleeper, str(tmp_path))
    with pytest.raises(ConfigError, match="holds no CRIU dump"):
        criu.restore(str(tmp_path / "elsewhere"))
    with pytest.raises(ConfigError, match="a PID is a positive integer"):
        criu.dump(0, str(tmp_path / "x"))


def _wait_count(path: Path, above: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            n = int(path.read_text() or 0)
        except (OSError, ValueError):
            n = 0
        if n > above:
            return n
        time.sleep(0.02)
    raise AssertionError(f"count in {path} did not pass {above}")


@pytest.mark.skipif(os.geteuid() != 0, reason="CRIU needs root")
def test_dump_and_restore_a_real_process(tmp_path: Path) -> None:
    if not installed():
        pytest.skip("criu is not installed (Debian: apt install criu)")
    try:
        criu.requirements(gpu=False)
    except ProcessCheckpointError as exc:
        assert str(exc).startswith("`criu check` failed, so CRIU cannot checkpoint here")
        pytest.skip(f"criu check fails on this machine, dump/restore not run: {exc}")
    count = tmp_path / "count"
    proc = subprocess.Popen(
        [sys.executable, "-c", COUNTER, str(count)],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    images = tmp_path / "images"
    restored = None
    try:
        _wait_count(count, 10)
        result = criu.dump(proc.pid, str(images))
        proc.wait(timeout=30)  # CRIU stopped it; reap it so its PID is free for the restore
        at_dump = int(count.read_text())
        assert result.gpu is False and result.bytes > 0 and (images / criu.MANIFEST).exists()
        time.sleep(0.3)
        assert int(count.read_text()) == at_dump  # nothing runs while dumped
        back = criu.restore(str(images))
        restored = back.pid
        assert restored == proc.pid  # CRIU restores the old PID
        after = _wait_count(count, at_dump)
        assert at_dump < after < at_dump + 500  # it continued its count, it did not start again
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if restored is not None:
            os.kill(restored, signal.SIGKILL)
        shutil.rmtree(images, ignore_errors=True)
