"""gpu_proof.sh, the first part: what the machine is (GPU model, driver, CUDA, runtime, the
Python packages ferry uses), written as JSON to the path given, for ``summary.py``.

    python env.py OUT/env.json
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import say

PACKAGES = (
    "torch",
    "numpy",
    "cuda-bindings",
    "cuda-core",
    "nvidia-ml-py",
    "xxhash",
    "fsspec",
    "click",
    "pytest",
    "pytest-timeout",
    "triton",
)


def _run(*cmd: str) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({cmd[0]}: {exc})"
    return (out.stdout.strip() or out.stderr.strip() or f"(exit {out.returncode})")[:2000]


def runtime() -> str:
    """gVisor (its kernel says 4.4.0, which no kernel that runs a current NVIDIA driver does;
    /proc/version says which), or Linux and its kernel."""
    if platform.release().startswith("4.4.0"):
        version = Path("/proc/version").read_text().strip() if Path("/proc/version").exists() else ""
        return f"gVisor (kernel 4.4.0: {version[:80]})"
    return f"Linux {platform.release()}"


def versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def cuda() -> dict[str, Any]:
    import torch

    doc: dict[str, Any] = {"torch_cuda": torch.version.cuda, "gpus": torch.cuda.device_count()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        doc.update(
            name=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
        )
    try:
        from cuda.bindings import driver as cu

        cu.cuInit(0)
        err, version = cu.cuDriverGetVersion()
        doc["driver_cuda"] = f"{version // 1000}.{version % 1000 // 10}" if int(err) == 0 else str(err)
    except Exception as exc:  # any: what the bindings say is the finding
        doc["driver_cuda"] = f"({type(exc).__name__}: {exc})"
    return doc


def main() -> None:
    path = sys.argv[1]
    total, _, free = shutil.disk_usage("/tmp")
    doc: dict[str, Any] = {
        "runtime": runtime(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "cpus": os.cpu_count(),
        "host_memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "tmp_disk_gib": {"total": round(total / 2**30, 1), "free": round(free / 2**30, 1)},
        "nvidia_smi": _run(
            "nvidia-smi", "--query-gpu=name,driver_version,memory.total,pstate", "--format=csv,noheader"
        ),
        "nvidia_smi_cuda": next(
            (
                line.split("CUDA Version:")[1].split("|")[0].strip()
                for line in _run("nvidia-smi").splitlines()
                if "CUDA Version:" in line
            ),
            "?",
        ),
        "packages": versions(),
    }
    doc.update(cuda())
    Path(path).write_text(json.dumps(doc, indent=2))
    say(f"machine: {json.dumps(doc)}")


if __name__ == "__main__":
    main()
