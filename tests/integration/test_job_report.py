"""Issue 16: ``ferry report`` of a real job reads without the page beside it. A job with a
custom "checkpointed" exit code (77) is killed once (a failure: its lost work shaded),
stopped once (77: a checkpoint, not a failure), run again to its end; retention deleted
its early checkpoints. The timeline the figure is drawn from has exactly those marks, and
the PNG and the page's SVG are real figures with a title, axes and a legend."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from ferry.ops import report
from ferry.runtime.jobdir import JobDir

from test_cli_jobs import ferry, start, status, training, wait_for
from trainrun import train_command

pytestmark = pytest.mark.integration
CUSTOM_CODE = 77


def test_report_of_a_killed_stopped_and_resumed_job(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    home, ck, out = tmp_path / "home", tmp_path / "ck", tmp_path / "run"
    path = home / "jobs" / "r"
    options = ("--every-steps", "5", "--keep-last", "2", "--exit-code", str(CUSTOM_CODE),
               "--max-failures", "1", "--backoff", "0.1")  # fmt: skip
    command = train_command(out, "--sleep", "0.05", "--epochs", "2")
    proc = start(home, "r", ck, command, *options)
    wait_for("training to reach step 8", training(path, 8), proc)
    os.kill(status(path)["worker_pid"], signal.SIGKILL)  # a crash: restarted from its last checkpoint
    wait_for(
        "the restarted worker",
        lambda: (
            status(path).get("restarts", 0) == 0
            and status(path).get("state") == "running"
            and status(path).get("failures", 0) == 1
            and status(path)["step"] >= 10
        ),
        proc,
    )
    stopped = ferry(home, "checkpoint", "r", "--stop", "--wait", "--timeout", "60")
    assert stopped.exit_code == 0, stopped.output
    proc.communicate(timeout=60)
    assert proc.returncode == CUSTOM_CODE
    again = start(home, "r", ck, command, *options)
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err

    job = JobDir(str(path))
    timeline = report.build("r", job.events(), job.status(), exists=report.checkpoint_exists)
    # 77 is no failure; the second `ferry run` of the job picked up where the stop left it
    assert [m["kind"] for m in timeline.marks] == ["failure", "stop", "resume"]
    (lost,) = timeline.lost
    assert 0 < lost["end"] - lost["start"] < 30
    assert len(timeline.segments) == 3 and len(timeline.startups) == 3  # every worker's start-up
    for span, seg in zip(timeline.startups, timeline.segments, strict=True):
        assert span["start"] < seg[0][0] <= span["end"] + 0.05  # training begins as the start-up ends
    steps = [c["step"] for c in timeline.checkpoints]
    assert steps[0] == 5  # --every-steps N: the first save is at step N, none at step 0
    kept = [c["step"] for c in timeline.checkpoints if not c["deleted"]]
    assert kept == sorted(set(steps))[-2:]  # --keep-last 2: the rest deleted by retention
    assert timeline.max_step == 24

    made = ferry(home, "report", "r", "-o", str(tmp_path / "r.html"), "--json")
    assert made.exit_code == 0, made.output
    summary = json.loads(made.stdout)
    assert [m["kind"] for m in summary["marks"]] == ["failure", "stop", "resume"] and summary["runs"] == 2
    assert summary["deleted_checkpoints"] == len(steps) - 2 and summary["lost_seconds"] > 0
    png = (tmp_path / "r.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    page = (tmp_path / "r.html").read_text()
    assert "<svg" in page and "<script" not in page and "<?xml" not in page
    legend = ("training step", "wall time since the job started (s)", "ferry job r", "worker start-up",
              "work lost (recomputed)", "deleted by retention", "stop (checkpointed)", "failure")  # fmt: skip
    for text in legend:
        assert text in page, text
