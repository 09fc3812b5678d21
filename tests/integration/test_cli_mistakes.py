"""Issue: a new user's common mistakes, each through the real ``ferry`` command (a subprocess):
a checkpoint root, FERRY_HOME or bundle folder that cannot be written, a script named
without its interpreter, ``ferry run`` inside ``ferry run``, a URL with a scheme no storage
backend knows, a file or a bundle given where a checkpoint goes. Each ends in one line that
says what to do, the documented exit code, no traceback, and nothing touched: an export
that cannot be written leaves its job running; a report that cannot be written is refused
before it is drawn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ferry.runtime.jobdir import JobDir

from trainrun import env_for, stderr_of, wait_for

pytestmark = pytest.mark.integration

FERRY = [sys.executable, "-m", "ferry"]


def ferry(home: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FERRY, *args], env=env_for(home), capture_output=True, text=True, cwd=cwd, timeout=60
    )


def one_line(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    """The command failed with ``code`` in one ``ferry: error:`` line holding ``words``."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code and len(lines) == 1, (done.returncode, done.stderr)
    assert lines[0].startswith("ferry: error: ") and all(w in lines[0] for w in words), lines[0]


def usage_error(done: subprocess.CompletedProcess[str], *words: str) -> None:
    """Click's usage error (exit 2): its last line names the value and what is wrong."""
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: Invalid value") and all(w in last for w in words), last


def test_places_that_cannot_be_written_are_refused_before_anything_runs(tmp_path: Path) -> None:
    home, script = tmp_path / "home", tmp_path / "train.py"
    script.write_text("print('trained')\n")
    run = ["run", "--no-autotrack", "--job-id", "j"]
    for root in (script / "ck", "/proc/ferry-nowhere"):  # under a file; where nobody can make one
        done = ferry(home, *run, "--dir", str(root), "--", sys.executable, str(script))
        one_line(done, 2, f"the checkpoint root {root}", "give --dir a folder you can write")
        assert "trained" not in done.stdout
    assert not home.exists()  # the job directory was not made either
    done = ferry(tmp_path / "train.py" / "home", *run, "--", sys.executable, str(script))
    one_line(done, 2, "FERRY_HOME", "set FERRY_HOME to a folder you can write")
    done = ferry(script, "list")  # FERRY_HOME a file: was a NotADirectoryError traceback
    one_line(done, 8, "a file is in its way", "set FERRY_HOME to a folder")
    done = ferry(home, *run, "--json", "--dir", "/proc/ferry-nowhere", "--", sys.executable, str(script))
    assert done.returncode == 2 and not done.stderr, done.stderr
    assert json.loads(done.stdout)["exit"] == 2
    assert not home.exists()
    done = ferry(home, "run", "--", "train.py", "--lr", "3", cwd=tmp_path)  # no interpreter, no ./
    one_line(done, 2, "cannot run 'train.py'", "`ferry run -- python train.py --lr 3`")


def test_ferry_run_inside_ferry_run_is_refused_by_the_inner_one(tmp_path: Path) -> None:
    home = tmp_path / "home"
    inner = [*FERRY, "run", "--no-autotrack", "--", sys.executable, "-c", "print('trained')"]
    done = ferry(home, "run", "--no-autotrack", "--job-id", "outer", "--", *inner, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "trained" not in done.stdout
    (refusal,) = [line for line in done.stderr.splitlines() if line.startswith("ferry: error:")]
    assert "ferry run inside ferry run" in refusal and "job outer" in refusal, refusal
    assert "print(" in refusal  # names the command to run instead
    assert sorted(os.listdir(home / "jobs")) == ["outer"]  # no inner job was made
    # a variable left in a shell that outlived its job names a process that is no ancestor
    stale = subprocess.run(
        inner, env=env_for(home, FERRY_SUPERVISOR_PID="1"), capture_output=True, text=True, cwd=tmp_path
    )
    assert stale.returncode == 0 and "trained" in stale.stdout, stale.stderr


def test_urls_files_and_bundles_where_a_checkpoint_goes(tmp_path: Path) -> None:
    home, script = tmp_path / "home", tmp_path / "train.py"
    script.write_text("print('trained')\n")
    for args in (
        ["inspect", "nosuch://x"],
        ["verify", "nosuch://x"],
        ["resume", "nosuch://x"],
    ):
        usage_error(ferry(home, *args), "no storage backend knows the scheme nosuch://")
    one_line(ferry(home, "resume", str(script)), 4, "is a file, not a bundle or a checkpoint")
    bundle = tmp_path / "bundle"  # a bundle whose checkpoint is under checkpoints/
    bundle.mkdir()
    (bundle / "bundle.json").write_text("{}")
    one_line(ferry(home, "inspect", str(bundle)), 4, "is a bundle", f"{bundle}/checkpoints")


def test_an_export_that_cannot_be_written_leaves_the_job_running(tmp_path: Path) -> None:
    home, path, afile = tmp_path / "home", tmp_path / "home" / "jobs" / "j", tmp_path / "notes.txt"
    afile.write_text("")
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    proc = subprocess.Popen(
        [*FERRY, "run", "--no-autotrack", "--job-id", "j", "--dir", str(tmp_path / "ck"), "--", *sleeper],
        env=env_for(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for("its worker to start", lambda: JobDir(str(path)).status().get("worker_pid"), proc)
        usage_error(ferry(home, "export", "j", "nosuch://bundle"), "nosuch://")
        done = ferry(home, "export", "j", str(afile / "bundle"), "--timeout", "2")
        one_line(done, 2, "the bundle's folder", "give DEST_URL a folder you can write")
        assert os.listdir(path / "control") == []  # no stop request was written
        done = ferry(home, "report", "j", "-o", str(tmp_path / "nodir" / "r.html"))
        one_line(done, 2, "there is no folder", "give -o a file in a folder you can write")
        assert proc.poll() is None and JobDir(str(path)).status().get("state") == "starting"
    finally:
        proc.terminate()  # forwarded to the worker, which ends on it
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            stderr_of(proc)
