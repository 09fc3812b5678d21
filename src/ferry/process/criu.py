"""CRIU adapter: dump a whole process (CPU and, through CRIU's CUDA plugin, GPU) to a folder.

``criu dump -t PID -D DIR --shell-job`` writes the process tree's images and stops it
(``--leave-running`` keeps it going); ``criu restore -D DIR --shell-job
--restore-detached`` brings it back under its old PID. For a process that holds a GPU,
CRIU 4.0 or newer with ``cuda_plugin.so`` in its plugin folder does the CUDA part: with
driver r580+ through the driver API, with older drivers by running ``cuda-checkpoint``,
which must then be on PATH. Before anything runs, ``requirements`` names each missing
piece, and ``criu check`` must pass (kernel features, privileges).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from ferry.errors import ConfigError, ProcessCheckpointError
from ferry.process import nvml
from ferry.process.pids import check_pid, require_alive
from ferry.runtime.atomicjson import write_json_atomic
from ferry.runtime.jobdir import read_json

MIN_GPU_CRIU = (4, 0)
"""CRIU with the CUDA plugin (criu/plugins/cuda) and its device hooks."""
MANIFEST = "ferry-dump.json"
_TIMEOUT = 3600.0


@dataclass
class CriuInfo:
    path: str
    version: tuple[int, ...]
    plugin_dir: str
    cuda_plugin: str | None
    check_output: str = ""

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


@dataclass
class DumpResult:
    pid: int
    directory: str
    gpu: bool
    seconds: float
    leave_running: bool
    bytes: int = 0
    log: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


@dataclass
class RestoreResult:
    pid: int
    directory: str
    seconds: float
    log: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "directory": self.directory, "seconds": self.seconds, "log": self.log}


def plugin_dir() -> str:
    """Where criu loads plugins from: ``CRIU_LIBS_DIR`` if set, else its default."""
    return os.environ.get("CRIU_LIBS_DIR") or "/usr/lib/criu"


def find_criu() -> CriuInfo:
    path = shutil.which("criu") or next(
        (p for p in ("/usr/sbin/criu", "/sbin/criu") if os.access(p, os.X_OK)), None
    )
    if path is None:
        raise ProcessCheckpointError(
            "criu is not installed (not on PATH): install CRIU (Debian/Ubuntu: "
            "`apt install criu`; for GPU processes CRIU 4.0+ built with its "
            "CUDA plugin, from criu.org)"
        )
    out = _run([path, "--version"], timeout=30).stdout
    m = re.search(r"Version:\s*([0-9][0-9.]*)", out)
    version = tuple(int(x) for x in m.group(1).strip(".").split(".")) if m else (0,)
    pdir = plugin_dir()
    plugin = os.path.join(pdir, "cuda_plugin.so")
    return CriuInfo(path, version, pdir, plugin if os.path.exists(plugin) else None)


def uses_gpu(pid: int) -> bool:
    """Whether the process has an NVIDIA device open or mapped (then CRIU needs the CUDA plugin)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            if "/dev/nvidia" in f.read():
                return True
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/nvidia"):
                    return True
            except OSError:
                continue
    except OSError:
        return False
    return False


def requirements(gpu: bool) -> CriuInfo:
    """CRIU ready for this job, or one error naming every missing piece and what to do."""
    if os.geteuid() != 0:
        raise ProcessCheckpointError(
            "criu dump and restore need root (CAP_SYS_ADMIN, CAP_CHECKPOINT_RESTORE): "
            "run ferry process dump/restore as root"
        )
    info = find_criu()
    missing = []
    if gpu:
        if info.version < MIN_GPU_CRIU:
            missing.append(
                f"criu {info.version_text} is too old for GPU processes: install CRIU 4.0 or newer"
            )
        if info.cuda_plugin is None:
            missing.append(
                f"CRIU's CUDA plugin (cuda_plugin.so) is not in {info.plugin_dir}: build CRIU with "
                "`make cuda_plugin` and install it there, or set CRIU_LIBS_DIR"
            )
        try:
            major = int(nvml.driver_version().split(".")[0])
        except (nvml.NvmlUnavailable, ValueError):
            major = None
        if major is not None and major < 580 and shutil.which("cuda-checkpoint") is None:
            missing.append(
                f"driver r{major} needs the `cuda-checkpoint` utility on PATH for CRIU's CUDA "
                "plugin (github.com/NVIDIA/cuda-checkpoint), or upgrade to r580+"
            )
    if missing:
        raise ProcessCheckpointError("CRIU cannot checkpoint this GPU process: " + "; ".join(missing))
    check = _run([info.path, "check"], timeout=120)
    info.check_output = (check.stdout + check.stderr).strip()
    if check.returncode != 0:
        raise ProcessCheckpointError(
            "`criu check` failed, so CRIU cannot checkpoint here (common causes: not root on the host, "
            "a container without ptrace and checkpoint/restore capabilities, a CRIU older than the "
            f"kernel): {_last_errors(info.check_output)}"
        )
    return info


def dump(pid: int, directory: str, *, leave_running: bool = False) -> DumpResult:
    """Write ``pid``'s process tree to ``directory`` (created; must hold no dump yet)."""
    require_alive(check_pid(pid))
    directory = os.path.abspath(directory)
    if os.path.exists(os.path.join(directory, "inventory.img")):
        raise ConfigError(f"{directory} already holds a CRIU dump: use an empty folder")
    gpu = uses_gpu(pid)
    info = requirements(gpu)
    os.makedirs(directory, exist_ok=True)
    cmd = [info.path, "dump", "-t", str(pid), "-D", directory, "-o", "dump.log", "-v4", "--shell-job"]
    if leave_running:
        cmd.append("--leave-running")
    t0 = time.perf_counter()
    proc = _run(cmd, timeout=_TIMEOUT)
    seconds = time.perf_counter() - t0
    log = os.path.join(directory, "dump.log")
    if proc.returncode != 0:
        raise ProcessCheckpointError(
            f"criu dump of pid {pid} failed (exit {proc.returncode}): "
            f"{_log_errors(log, proc)}; full log: {log}"
        )
    size = sum(e.stat().st_size for e in os.scandir(directory) if e.is_file())
    manifest = {
        "pid": pid,
        "gpu": gpu,
        "leave_running": leave_running,
        "host": socket.gethostname(),
        "criu_version": info.version_text,
        "dumped_at": time.time(),
    }
    write_json_atomic(os.path.join(directory, MANIFEST), manifest, durable=True, mode=0o666)  # umask applies
    return DumpResult(pid, directory, gpu, seconds, leave_running, size, log)


def restore(directory: str) -> RestoreResult:
    """Bring back the process tree dumped in ``directory``, detached, under its old PID."""
    directory = os.path.abspath(directory)
    if not os.path.exists(os.path.join(directory, "inventory.img")):
        raise ConfigError(
            f"{directory} holds no CRIU dump (no inventory.img): give the folder `ferry process dump` wrote"
        )
    try:  # bounded, no link followed, a FIFO not waited on: the folder is only named by the user
        raw = read_json(os.path.join(directory, MANIFEST))
    except (OSError, ValueError):
        raw = None
    manifest: dict[str, Any] = raw if isinstance(raw, dict) else {}
    info = requirements(bool(manifest.get("gpu", False)))
    pidfile = os.path.join(directory, "restored.pid")
    if os.path.exists(pidfile):
        os.unlink(pidfile)
    cmd = [
        info.path,
        "restore",
        "-D",
        directory,
        "-o",
        "restore.log",
        "-v4",
        "--shell-job",
        "--restore-detached",
        "--pidfile",
        pidfile,
    ]
    t0 = time.perf_counter()
    proc = _run(cmd, timeout=_TIMEOUT)
    seconds = time.perf_counter() - t0
    log = os.path.join(directory, "restore.log")
    if proc.returncode != 0:
        hint = ""
        if manifest.get("pid") and os.path.exists(f"/proc/{manifest['pid']}"):
            hint = f" (pid {manifest['pid']} is taken by a running process; CRIU restores the old PID)"
        raise ProcessCheckpointError(
            f"criu restore from {directory} failed (exit {proc.returncode}){hint}: "
            f"{_log_errors(log, proc)}; full log: {log}"
        )
    with open(pidfile) as f:
        pid = int(f.read().strip())
    return RestoreResult(pid, directory, seconds, log, manifest)


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise ProcessCheckpointError(f"{' '.join(cmd[:2])} did not finish in {timeout:.0f} s") from exc
    except OSError as exc:
        raise ProcessCheckpointError(f"cannot run {cmd[0]}: {exc}") from exc


def _last_errors(text: str, n: int = 4) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln] or lines
    return " | ".join(errors[-n:]) or "no output"


def _log_errors(log: str, proc: subprocess.CompletedProcess[str]) -> str:
    try:
        with open(log, errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    return _last_errors(text or proc.stdout + proc.stderr)
