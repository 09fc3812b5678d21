"""Starting the jobs of the zero-code benchmarks (stall.py, overhead.py): the `ferry` command
and one job run whose failure ends the benchmark with what the job printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_job_process(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run one job; a failure ends the benchmark with what the job printed last."""
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-25:])
        raise SystemExit(f"{' '.join(cmd)}\nexited {out.returncode}; its last lines:\n{tail}")
    return out


def ferry_command() -> list[str]:
    """The `ferry` beside this python, or ``python -m ferry`` where ferry runs from source."""
    beside = Path(sys.executable).parent / "ferry"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "ferry"]
