"""A run that finds no checkpoint says so, and points to a checkpointed job of the same
command (runtime/samejob.py, session/resume.py's starting_fresh)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from ferry.runtime.jobdir import JobDir
from ferry.runtime.samejob import checkpointed_job
from ferry.session.resume import starting_fresh

ARGV = ["/usr/bin/python", "train.py", "--lr", "0.1"]


def job(home: Path, job_id: str, argv: list[str], ck: str, step: int | None, when: float = 1.0) -> None:
    jd = JobDir.create(job_id, str(home / "jobs" / job_id))
    jd.write_identity(id=job_id, argv=argv, checkpoint_dir=ck, cwd=os.getcwd())
    if step is not None:
        entry = {"step": step, "url": f"{ck}/step-{step}", "bytes": 1, "seconds": 0.1,
                 "blocking_seconds": 0.0, "time": when}  # fmt: skip
        jd.record_checkpoint(entry)


def test_points_to_the_newest_checkpointed_job_of_the_same_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("FERRY_HOME", str(tmp_path))
    job(tmp_path, "old", ARGV, "/ck/old", 5, when=1.0)
    job(tmp_path, "new", ARGV, "/ck/new", 9, when=2.0)
    job(tmp_path, "other-command", [*ARGV, "--more"], "/ck/x", 50, when=3.0)
    job(tmp_path, "never-saved", ARGV, "/ck/none", None)
    job(tmp_path, "this", ARGV, "/ck/this", 3, when=4.0)  # the job itself: not a pointer
    job(tmp_path, "done", ARGV, "/ck/done", 20, when=5.0)  # finished: nothing to resume there
    JobDir(str(tmp_path / "jobs" / "done")).update_status("finished", exit_code=0)
    found = checkpointed_job(ARGV, os.getcwd(), not_dir="/ck/this", not_id="this")
    assert found is not None and (found.id, found.checkpoint_dir, found.step) == ("new", "/ck/new", 9)
    assert checkpointed_job(ARGV, os.getcwd(), not_dir="/ck/new", not_id="zzz") is not None
    assert checkpointed_job(["python", "eval.py"], os.getcwd(), not_dir="/x", not_id="this") is None

    caplog.set_level(logging.INFO, logger="ferry")
    monkeypatch.setattr(logging.getLogger("ferry"), "propagate", True)
    starting_fresh("/ck/this", "this", ARGV)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "ferry: no checkpoint under /ck/this: starting fresh",
        "ferry: job new ran this same command and checkpointed step 9 under /ck/new: to resume it "
        "instead, run with --dir /ck/new",
    ]


def test_no_jobs_folder_no_pointer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_HOME", str(tmp_path / "nothing"))
    assert checkpointed_job(ARGV, os.getcwd(), not_dir="/ck", not_id="j") is None
