"""`ferry chaos`: unmodified training scripts (they never import ferry) under seeded faults -
checkpoint requests, stops, preemption signals, SIGKILL of the worker and of the supervisor,
migrations, a full disk for one save, the remote the checkpoints are copied to down for a
while - must end with the uninterrupted run's parameters and per-step losses, bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ferry.cli import main

from trainrun import SCRIPTS, env_for

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent
# Cheap faults (checkpoint requests, a full disk) are drawn more often than those that
# restart the worker: each restart costs a torch import, seconds on this machine.
CHEAP = ["checkpoint"] * 8 + ["disk-full"] * 3
KINDS = ",".join(
    [*CHEAP, "stop", "preempt", "kill-worker", "kill-supervisor", "migrate", *["remote-down"] * 2]
)
# torchrun: requests, worker (rank) and supervisor kills, the remote down (rank 0 copies).
# A restart starts three Pythons that import torch: fewer of them than in the single run.
DDP_KINDS = ",".join([*CHEAP, *["checkpoint"] * 4, "stop", "kill-worker", "kill-supervisor", "remote-down"])


def soak(
    tmp: Path, seed: int, kinds: str, args: list[str], command: list[str], events: int = 20
) -> dict[str, object]:
    cmd = [str(BIN / "ferry"), "chaos", "--seed", str(seed), "--events", str(events),
           "--work", str(tmp / "w"), "--pause", "0.1", "0.3", "--outage", "1", "3", "--kinds", kinds,
           "--env", "AWS_MAX_ATTEMPTS=1", "--json", *args, "--", *command]  # fmt: skip
    proc = subprocess.run(cmd, env=env_for(tmp / "home"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    summary = json.loads(proc.stdout)
    assert isinstance(summary, dict)
    return summary


def check(summary: dict[str, object], events: int = 20) -> None:
    assert summary["equal"] is True, summary["differences"]
    assert summary["events"] == events
    injected = summary["injected"]
    assert isinstance(injected, dict) and len(injected) >= 4, injected
    assert isinstance(summary["checkpoints"], int) and summary["checkpoints"] > 0


def test_single_process_soak_equals_uninterrupted(tmp_path: Path) -> None:
    summary = soak(
        tmp_path,
        1,
        KINDS,
        ["--compare", "out/params.txt", "--steps", "out/log.txt"],
        [sys.executable, str(SCRIPTS / "zc_epochs.py"), "--out", "out", "--epochs", "6", "--sleep", "0.08"],
    )
    check(summary)
    if os.geteuid() == 0:  # the full disk needs a tmpfs of its own
        assert "disk-full" not in summary["skipped_kinds"]  # type: ignore[operator]
    # The remote went down while copies were under way, and ferry's retries met it (the S3
    # client's own retries are off: AWS_MAX_ATTEMPTS=1); every copy the remote lists as
    # committed was read back whole.
    assert summary["injected"]["remote-down"] >= 1  # type: ignore[index]
    assert summary["remote_retries"] > 0, summary  # type: ignore[operator]
    assert summary["remote_copies"] > 0 and summary["remote_verified"] > 0, summary  # type: ignore[operator]


def test_torchrun_two_ranks_soak_equals_uninterrupted(tmp_path: Path) -> None:
    ranks = ["--steps", "out/rank0/log.txt", "--steps", "out/rank1/log.txt"]
    summary = soak(
        tmp_path,
        2,
        DDP_KINDS,
        ["--compare", "out/params.txt", *ranks],
        [
            str(BIN / "torchrun"),
            "--standalone",
            "--nproc_per_node",
            "2",
            str(SCRIPTS / "zc_ddp.py"),
            "--out",
            "out",
            "--epochs",
            "6",
            "--sleep",
            "0.08",
        ],
    )
    check(summary)


def test_usage_errors_name_the_fix(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["chaos", "--work", str(tmp_path), "--", "python", "x.py"])
    assert result.exit_code == 2 and "--compare FILE" in result.output
    result = runner.invoke(main, ["chaos", "--kinds", "nap", "--compare", "a", "--", "python", "x.py"])
    assert result.exit_code == 2 and "unknown fault kind" in result.output
