"""Issue: the operator CLI's bad input. Unknown job, dead PID, a PID that is not a ferry job,
a job already checkpointing, a device that does not exist or is the job's own: each a
one-line error with its documented exit code, and the job is left untouched (no request).

The job here is a job directory written by hand for a live process (``sleep``) whose lock
this test holds: a real worker cannot be kept in ``checkpointing`` on demand. Real jobs
run in tests/integration/test_cli_jobs.py and test_cli_migrate.py."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ferry.cli import main
from ferry.errors import ConfigError
from ferry.ops import devices, figure, report
from ferry.process import nvml
from ferry.runtime.atomicjson import write_json_atomic
from ferry.runtime.jobdir import JobDir


def ferry(home: Path, *args: str) -> Result:
    env = {k: None for k in os.environ if k.startswith("FERRY_")}
    return CliRunner().invoke(main, list(args), env={**env, "FERRY_HOME": str(home)})


def usage_error(result: Result, option: str, *words: str) -> None:
    """Click's usage error (exit 2), naming the option as typed."""
    assert result.exit_code == 2, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: Invalid value for '{option}'"), result.stderr
    for word in words:
        assert word in last, last


def one_line_error(result: Result, code: int, *words: str) -> None:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ferry: error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Path, JobDir, subprocess.Popen[bytes]]]:
    """A running job "w" on CUDA_VISIBLE_DEVICES=0 whose supervisor lock this test holds."""
    worker = subprocess.Popen(["sleep", "60"], env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"})
    home = tmp_path / "home"
    job = JobDir.create("w", str(home / "jobs" / "w"))
    job.acquire_lock()
    job.write_identity(id="w", supervisor_pid=os.getpid(), worker_pid=worker.pid, command=["sleep", "60"])
    job.update_status("running", step=7, worker_pid=worker.pid, max_restarts=1, restarts=0)
    yield home, job, worker
    job.release_lock()
    worker.kill()
    worker.wait()


def untouched(job: JobDir, worker: subprocess.Popen[bytes]) -> None:
    assert os.listdir(job.control) == [] and worker.poll() is None


def test_unknown_job_dead_pid_and_foreign_pid(tmp_path: Path) -> None:
    one_line_error(ferry(tmp_path, "checkpoint", "nope"), 8, "no ferry job 'nope'", "ferry list")
    done = subprocess.Popen(["true"])
    done.wait()
    one_line_error(ferry(tmp_path, "status", str(done.pid)), 8, f"no process {done.pid}")
    other = subprocess.Popen(["sleep", "30"])
    try:
        result = ferry(tmp_path, "migrate", str(other.pid), "--to", "1")
        one_line_error(
            result, 8, f"pid {other.pid} (sleep 30) is not a ferry job", "ferry process suspend", "ferry run"
        )
    finally:
        other.kill()
        other.wait()
    one_line_error(ferry(tmp_path, "checkpoint", "a/b"), 2, "not a job id or a PID")
    one_line_error(ferry(tmp_path, "checkpoint"), 2, "either JOB or --all")
    usage_error(ferry(tmp_path, "checkpoint", "x", "--wait", "--timeout", "0"), "--timeout", "above 0")


def test_busy_and_bad_devices_leave_the_job_untouched(live: Any) -> None:
    home, job, worker = live
    assert json.loads(ferry(home, "list", "--json").stdout)["jobs"][0]["devices"] == "0"
    usage_error(ferry(home, "migrate", "w", "--to", "gpu1"), "--to", "not a device list")
    usage_error(ferry(home, "migrate", "w", "--to", "1,1"), "--to", "names a device twice")
    one_line_error(
        ferry(home, "migrate", str(worker.pid), "--to", "0"), 2, "already runs on", "nothing to move"
    )
    untouched(job, worker)
    if nvml.status() is not None:  # no NVML here: the target cannot be checked, so it is refused
        one_line_error(
            ferry(home, "migrate", "w", "--to", "1"), 2, "refused: cannot check that device(s) 1 exist",
            "--unchecked-devices",
        )  # fmt: skip
        untouched(job, worker)
    job.update_status("running", step=9, restarts=1)
    one_line_error(ferry(home, "migrate", "w", "--to", "1"), 8, "no in-place restart left", "--max-restarts")
    untouched(job, worker)


def test_a_request_to_a_job_that_is_checkpointing_queues(live: Any) -> None:
    """A save in flight does not refuse a request: the worker takes it at the next safe point
    after that save (tests/integration/test_cli_jobs.py runs it against a real job)."""
    home, job, worker = live
    job.update_status("checkpointing", step=8)
    queued = ferry(home, "checkpoint", "w")
    assert queued.exit_code == 0 and "checkpoint requested" in queued.stdout, queued.output
    assert [n for n in os.listdir(job.control) if n.startswith("req-")] != [] and worker.poll() is None


def test_a_dead_job_and_the_preStop_form(live: Any) -> None:
    home, job, worker = live
    job.release_lock()  # its supervisor is gone
    one_line_error(ferry(home, "checkpoint", "w", "--wait"), 8, "not running", "ferry resume")
    everyone = ferry(home, "checkpoint", "--all", "--wait")
    assert everyone.exit_code == 0 and "no running ferry jobs" in everyone.stdout, everyone.output
    assert json.loads(ferry(home, "list", "--json").stdout)["jobs"] == []
    assert json.loads(ferry(home, "list", "--all", "--json").stdout)["jobs"][0]["state"] == "dead"
    untouched(job, worker)


def test_devices_are_checked_honestly() -> None:
    assert devices.parse("0, 1") == ["0", "1"]
    assert devices.parse("GPU-8f2c1a3b-0000-1111-2222-333344445555") == [
        "GPU-8f2c1a3b-0000-1111-2222-333344445555"
    ]
    for bad in ("", "cuda:0", "0,,1", "-1"):
        with pytest.raises(ConfigError):
            devices.parse(bad)
    value, warning = devices.check("1")
    assert value == "1"
    if warning is not None:  # no NVML here: it says it could not check, and why
        assert "cannot check that device(s) 1 exist" in warning


def test_report_draws_failures_and_migrations(tmp_path: Path) -> None:
    t = time.time()
    events = [
        {"time": t, "event": "run_start"},
        {"time": t + 0.1, "event": "worker_start", "pid": 1},
        {"time": t + 2, "event": "checkpoint", "step": 10, "url": "u/10", "seconds": 0.5, "bytes": 1},
        {"time": t + 5, "event": "worker_exit", "returncode": -9},
        {"time": t + 6, "event": "worker_start", "pid": 2},
        {"time": t + 6, "event": "restart", "reason": "failure", "pid": 2, "downtime_seconds": 1},
        {"time": t + 8, "event": "resume", "step": 10, "url": "u/10", "seconds": 0.2},
        {"time": t + 9, "event": "stop", "step": 14, "url": "u/14"},
        {"time": t + 10, "event": "worker_start", "pid": 3},
        {"time": t + 10, "event": "restart", "reason": "requested", "env": {"CUDA_VISIBLE_DEVICES": "1"}},
        {"time": t + 12, "event": "resume", "step": 14, "url": "u/14", "seconds": 0.1},
    ]
    tl = report.build("r", events, {"state": "finished", "step": 20, "updated": t + 14})
    # the stop at t + 9 was the migration's (a requested restart followed): one mark, at the stop
    assert [m["kind"] for m in tl.marks] == ["failure", "migration"]
    assert [m["time"] - t for m in tl.marks] == pytest.approx([5, 9])
    assert tl.lost_seconds == pytest.approx(3.0) and tl.max_step == 20
    drawing = figure.draw(tl)
    page = report.page(tl, {"state": "finished", "step": 20}, figure.svg(drawing))
    assert "3.0 s of work since the last checkpoint lost" in page and page.count("<svg") == 1
    png = figure.png(drawing)
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    # A job directory holding these events reports through the CLI too.
    job = JobDir.create("r", str(tmp_path / "jobs" / "r"))
    job.write_identity(id="r", command=["python", "t.py"])
    write_json_atomic(job.file("status.json"), {"state": "finished", "step": 20, "updated": t + 14})
    Path(job.file("events.jsonl")).write_text("".join(json.dumps(e) + "\n" for e in events))
    result = ferry(tmp_path, "report", "r", "-o", str(tmp_path / "r.html"))
    assert result.exit_code == 0 and (tmp_path / "r.png").stat().st_size > 100, result.output
