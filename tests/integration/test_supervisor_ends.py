"""How a job's run ends, with what was asked of it meanwhile: a control request that comes
while the job stops is answered and removed, and none carries over to the next run (issue 26,
item 10); a worker that took over from a warm migration checkpoints and stops when `ferry run`
is SIGKILLed, like a cold-started worker (issue 27, item 2)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from ferry.runtime.control import read_response, submit
from ferry.runtime.jobdir import JobDir

from reference import reference_run
from test_cli_jobs import ferry, start, status, training, wait_for
from trainrun import SCRIPTS, assert_same

pytestmark = pytest.mark.integration
EXIT_CHECKPOINTED = 85


def command(tmp: Path, *hooks: str, sleep: float = 0.15) -> list[str]:
    """train_explicit.py with its defaults (the ``reference`` run's results), ``sleep`` s a step
    while the test needs it (the file ``slow`` exists)."""
    return [sys.executable, str(SCRIPTS / "launcher_wrap.py"), *hooks, "--out", str(tmp / "run"),
            "--sleep", str(sleep), "--sleep-while", str(tmp / "slow")]  # fmt: skip


def stops(path: Path, since: float) -> list[int]:
    return [
        int(e["step"] or 0) for e in JobDir(str(path)).events() if e["event"] == "stop" and e["time"] >= since
    ]


def test_requests_during_a_stop_are_answered_and_none_reaches_the_next_run(
    tmp_path: Path, reference: Path
) -> None:
    """SIGTERM; while the worker exits after its stop's commit, `ferry checkpoint --stop` (no
    --wait: it returns at once) and a restart request come in. Both are answered when the run
    ends (the stop joins the stop's checkpoint; the restart is refused: the job is stopping),
    and the next run trains to its end, bitwise, instead of stopping at once with 85. A request
    left by a run that ended before it could answer is answered by the next run's start."""
    home, path = tmp_path / "home", tmp_path / "home" / "jobs" / "j"
    (tmp_path / "slow").touch()
    (tmp_path / "linger").touch()
    proc = start(home, "j", tmp_path / "ck", command(tmp_path, "--linger", str(tmp_path / "linger")))
    wait_for("training to reach step 3", training(path), proc)
    t = time.time()
    proc.send_signal(signal.SIGTERM)
    wait_for("the stop's checkpoint", lambda: status(path).get("state") == "checkpointed", proc)
    asked = ferry(home, "checkpoint", "j", "--stop")  # the worker lingers at exit: the job is alive
    assert asked.exit_code == 0 and "stop requested" in asked.stdout, asked.output
    (stop_rid,) = [line.split("request ")[1].rstrip(")") for line in asked.stdout.splitlines()]
    restart_rid = submit(JobDir(str(path)), "restart", {"CUDA_VISIBLE_DEVICES": "1"})
    (tmp_path / "linger").unlink()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_CHECKPOINTED, err
    (step,) = stops(path, t)
    joined = read_response(JobDir(str(path)), stop_rid)
    assert joined is not None and joined["ok"] and joined["step"] == step, joined
    refused = read_response(JobDir(str(path)), restart_rid)
    assert refused is not None and not refused["ok"], refused
    assert "the job is stopping (checkpointed, exit 85)" in refused.get("error", "")
    assert not [n for n in os.listdir(path / "control") if n.startswith("req-")]

    # a request that landed after the run's last look (its supervisor was gone a moment later)
    late = submit(JobDir(str(path)), "stop")
    (tmp_path / "slow").unlink()
    second = start(home, "j", tmp_path / "ck", command(tmp_path))
    _, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    answer = read_response(JobDir(str(path)), late)
    assert answer is not None and not answer["ok"] and "stopped before it took" in answer.get("error", "")
    assert stops(path, t) == [step] and "resumed from" in err
    assert_same(reference, tmp_path / "run")


def test_sigkill_of_ferry_run_after_a_warm_take_over_checkpoints_and_resumes_exactly(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """After a warm migration, the worker that took over is the job's worker: when `ferry run`
    is SIGKILLed (a scheduler's kill, the OOM killer) it gets SIGTERM, not the warm worker's
    SIGKILL, commits a checkpoint and exits 85; the next run resumes from it, bitwise."""
    epochs = ("--epochs", "10")  # test_warm_migrate's reference: room for the migration
    reference = reference_run(tmp_path_factory, args=epochs)
    home, path = tmp_path / "home", tmp_path / "home" / "jobs" / "w"
    (tmp_path / "slow").touch()
    # 120 steps of 0.4 s: room for a warm worker's start (python and torch) on a busy machine
    proc = start(home, "w", tmp_path / "ck", [*command(tmp_path, sleep=0.4), *epochs], "--max-restarts", "1")
    wait_for("training to reach step 3", training(path), proc)
    moved = ferry(home, "migrate", "w", "--to", "1", "--unchecked-devices", "--timeout", "60", "--json")
    assert moved.exit_code == 0, moved.output
    doc = json.loads(moved.stdout)
    assert doc["warm"], doc
    wait_for("the new worker to train", training(path, int(status(path)["step"]) + 2), proc)
    worker = int(status(path)["worker_pid"])
    assert worker == doc["pid"]
    t = time.time()
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 60
    while JobDir(str(path)).is_locked() and time.monotonic() < deadline:  # the worker stops
        time.sleep(0.05)
    assert not JobDir(str(path)).is_locked()
    (step,) = stops(path, t)
    final = status(path)
    assert final["state"] == "checkpointed" and final["last_checkpoint"]["step"] == step == final["step"]
    (tmp_path / "slow").unlink()
    again = start(home, "w", tmp_path / "ck", [*command(tmp_path), *epochs])
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert f"at step {step}" in err
    assert_same(reference, tmp_path / "run")
