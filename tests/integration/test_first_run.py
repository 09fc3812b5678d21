"""Issue 30, the first five minutes, through the real CLI (``python -m ferry``): a job run
with no option at all, stopped by SIGTERM, resumes when the same command runs again in the
same folder; once it finished, running it again says so and trains nothing; its report
follows it across both runs; and a bundle of it resumes from any folder, its relative
script found in the job's own working directory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ferry.ops import report
from ferry.ops.jobs import JobRecord
from ferry.runtime.jobdir import JobDir

from trainrun import SCRIPTS, env_for, wait_for
from trainrun import job_status as status

pytestmark = pytest.mark.integration
FERRY = [sys.executable, "-m", "ferry"]
EXIT_CHECKPOINTED = 85


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_rerun_resumes_finished_stays_finished_and_a_bundle_resumes_anywhere(tmp_path: Path) -> None:
    home, work, elsewhere = tmp_path / "home", tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    shutil.copy(SCRIPTS / "zc_epochs.py", work / "train.py")
    command = [sys.executable, "train.py", "--out", "out", "--epochs", "2", "--sleep", "0.05"]
    env = env_for(home)

    # 1. no --dir, no --job-id: the job is named by the folder and the command line
    first = subprocess.Popen([*FERRY, "run", "--", *command], cwd=work, env=env, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)  # fmt: skip
    wait_for("the job directory", lambda: (home / "jobs").is_dir() and any((home / "jobs").iterdir()), first)
    (job_dir,) = (home / "jobs").iterdir()
    job = job_dir.name
    wait_for("training to reach step 5", lambda: status(job_dir).get("step", 0) >= 5, first)
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=120)
    assert first.returncode == EXIT_CHECKPOINTED, err
    assert f"ferry run: job {job} (named by the working directory and the command line" in err, err
    assert "run the same command again, in the same folder, to resume" in err, err
    root = work / "ferry-checkpoints" / job
    stopped = status(job_dir)["step"]

    # 2. the same command, nothing added: it resumes where it stopped, and finishes
    again = subprocess.run([*FERRY, "run", "--", *command], cwd=work, env=env, capture_output=True,
                           text=True, timeout=180)  # fmt: skip
    assert again.returncode == 0, again.stderr
    resumes = [e for e in JobDir(str(job_dir)).events() if e["event"] == "resume"]
    assert [e["step"] for e in resumes] == [stopped], resumes
    assert (root / "finished.json").is_file()
    trained = lines(work / "out" / "log.txt")
    assert trained[-1].startswith("test"), trained[-3:]  # both epochs ran to their end

    # 3. once more: it finished, so it says so and trains nothing (no worker started)
    starts = [e for e in JobDir(str(job_dir)).events() if e["event"] == "worker_start"]
    done = subprocess.run([*FERRY, "run", "--", *command], cwd=work, env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"job {job} finished at step 32" in done.stderr and "--fresh" in done.stderr, done.stderr
    assert [e for e in JobDir(str(job_dir)).events() if e["event"] == "worker_start"] == starts
    assert lines(work / "out" / "log.txt") == trained

    # 4. one report for both runs: the stop and the resume on one time axis
    records = [JobRecord.load(str(job_dir))]
    events, last = report.merged(report.lineage(records[0], records))
    timeline = report.build(job, events, last)
    assert timeline.runs == 2 and [m["kind"] for m in timeline.marks] == ["stop", "resume"], timeline.marks

    # 5. its bundle resumes from any folder: the script is found where the job ran
    bundle = tmp_path / "bundle"
    exported = subprocess.run([*FERRY, "export", job, str(bundle)], cwd=work, env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    moved = subprocess.run([*FERRY, "resume", str(bundle), "--dir", str(tmp_path / "moved")], cwd=elsewhere,
                           env=env, capture_output=True, text=True, timeout=180)  # fmt: skip
    assert moved.returncode == 0, moved.stderr
    assert f"resumed from {tmp_path / 'moved'}/step-" in moved.stderr, moved.stderr
    assert not os.listdir(elsewhere)  # it ran in the job's folder, not here
