"""Issue 13 (trust): other local users cannot steer a job through the hand-over folder or a
pre-created job home; settings come from where they are given; a failure on one rank ends
every rank at once; a ``FunctionCheckpoint``'s files survive multi-rank saves and in-place
restarts. Real ``ferry run``, real torchrun on gloo, real users (as root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ferry.runtime.control import submit
from ferry.runtime.jobdir import JobDir
from ferry.supervisor.worker import handoff_dir

from trainrun import SCRIPTS, env_for, wait_for
from trainrun import job_status as status

pytestmark = pytest.mark.integration

FERRY = [sys.executable, "-c", "from ferry.cli import main; main()", "run"]
TORCHRUN = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2"]
FUNCTIONS = [sys.executable, str(SCRIPTS / "train_functions.py")]
RANKS = str(SCRIPTS / "ranks_functions.py")
NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to act as another user (uid 65534)")


def run(cmd: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------ FunctionCheckpoint
def test_function_checkpoint_files_of_every_rank_are_saved_and_resumed(tmp_path: Path) -> None:
    """torchrun, 2 ranks: each rank's FunctionCheckpoint files are in the checkpoint and each
    rank resumes from its own; the resumed run ends where an uninterrupted one does."""
    env = env_for(
        tmp_path / "home", OMP_NUM_THREADS="1", FERRY_EVERY_STEPS="5", FERRY_DIR=str(tmp_path / "ck")
    )
    first = run([*TORCHRUN, RANKS, "--out", str(tmp_path / "first"), "--steps", "12"], env)
    assert first.returncode == 0, first.stderr[-3000:]
    newest = max((tmp_path / "ck").iterdir())
    files = json.loads((newest / "manifest.json").read_text())["files"]
    assert {"user/value.json", "rank-1/user/value.json"} <= set(files), sorted(files)

    resumed = run([*TORCHRUN, RANKS, "--out", str(tmp_path / "run"), "--steps", "17"], env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "rank 0 resumed at step 10" in resumed.stdout and "rank 1 resumed at step 10" in resumed.stdout

    straight = env_for(tmp_path / "home2", OMP_NUM_THREADS="1", FERRY_DIR=str(tmp_path / "ck2"))
    ref = run([*TORCHRUN, RANKS, "--out", str(tmp_path / "ref"), "--steps", "17"], straight)
    assert ref.returncode == 0, ref.stderr[-3000:]
    for rank in (0, 1):
        name = f"rank{rank}.txt"
        assert (tmp_path / "run" / name).read_text() == (tmp_path / "ref" / name).read_text()


def test_function_checkpoint_survives_an_in_place_restart(tmp_path: Path) -> None:
    """The restarted worker takes the state handed over in memory, and the FunctionCheckpoint
    reads its files from the durable checkpoint (the hand-over copy is gone by then)."""
    ref = run(
        [*FUNCTIONS, "--out", str(tmp_path / "ref")], env_for(tmp_path / "h0", FERRY_DIR=str(tmp_path / "c0"))
    )
    assert ref.returncode == 0, ref.stderr
    path = tmp_path / "home" / "jobs" / "fr"
    options = ["--no-autotrack", "--job-id", "fr", "--dir", str(tmp_path / "ck"), "--max-restarts", "1"]
    command = [*FUNCTIONS, "--out", str(tmp_path / "run"), "--sleep", "0.1"]
    proc = subprocess.Popen(
        [*FERRY, *options, "--", *command],
        env=env_for(tmp_path / "home"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for("training to reach step 3", lambda: status(path).get("step", 0) >= 3, proc)
    submit(JobDir.open(str(path)), "restart", env={"FERRY_TEST_MARK": "2"})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "was handed over in host memory" in err and "AssertionError" not in err
    for name in ("value.txt", "steps.txt"):
        assert (tmp_path / "run" / name).read_text() == (tmp_path / "ref" / name).read_text()


# ------------------------------------------------------------------ a failure on one rank
def test_an_exception_on_one_rank_ends_every_rank_at_once(tmp_path: Path) -> None:
    """Rank 1 raises an exception of the script's own and its process lingers (a non-daemon
    thread); rank 0 waits in ferry's agreement. Before: rank 0 waited for the process
    group's timeout (30 minutes). Now the job ends within seconds, naming the cause."""
    env = env_for(
        tmp_path / "home", OMP_NUM_THREADS="1", FERRY_EVERY_STEPS="5", FERRY_DIR=str(tmp_path / "ck")
    )
    cmd = [
        *TORCHRUN,
        RANKS,
        "--out",
        str(tmp_path / "run"),
        "--steps",
        "40",
        "--raise-at",
        "3",
        "--sleep",
        "0.1",
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [*cmd, "--linger"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        _kill_job(proc)
        pytest.fail("the ranks were still waiting for each other after 120 s")
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 120
    assert "ValueError: the script's own failure on rank 1 at step 3" in out
    assert "ferry: rank 1 failed (ValueError" in out
    assert not (tmp_path / "run").exists()


def _kill_job(proc: subprocess.Popen[str]) -> None:
    """torchrun and the ranks it started (each in a session of its own), by their command."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if RANKS.encode() in cmdline:
                os.kill(int(entry.name), 9)
    proc.kill()
    proc.communicate()


# ------------------------------------------------------------------ settings
def test_ferry_run_honours_ferry_dir_from_the_environment(tmp_path: Path) -> None:
    env = env_for(tmp_path / "home", FERRY_DIR=str(tmp_path / "from-env"))
    done = run(
        [*FERRY, "--job-id", "e", "--", sys.executable, "-c", "import os; print(os.environ['FERRY_DIR'])"],
        env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "from-env")
    assert JobDir(str(tmp_path / "home" / "jobs" / "e")).identity()["checkpoint_dir"] == str(
        tmp_path / "from-env"
    )


def test_ferry_run_refuses_an_unknown_scheme_before_the_worker_starts(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    done = run([*FERRY, "--dir", "foo://x", "--", "touch", str(marker)], env_for(tmp_path / "home"))
    assert done.returncode == 2 and "no storage backend knows the scheme foo://" in done.stderr, done.stderr
    assert "Error: Invalid value for '--dir'" in done.stderr and not marker.exists()


# ------------------------------------------------------------------ other local users
@root_only
def test_a_planted_hand_over_folder_is_refused(tmp_path: Path) -> None:
    """Another user plants a copy of a checkpoint (weights of their choosing) where the
    job's hand-over folder will be looked for: the job resumes from its durable checkpoint
    and says why it ignored the folder."""
    home, ck = tmp_path / "home", tmp_path / "ck"
    env = env_for(home)
    options = ["--no-autotrack", "--job-id", "pl", "--dir", str(ck)]
    stopped = run(
        [*FERRY, *options, "--", *FUNCTIONS, "--out", str(tmp_path / "run"), "--signal-at", "10"], env
    )
    assert stopped.returncode == 85, stopped.stderr
    (saved,) = [p for p in ck.iterdir() if p.name.startswith("step-")]

    planted = Path(handoff_dir(str(home / "jobs" / "pl")))
    parent_existed = planted.parent.exists()
    try:
        planted.parent.mkdir(mode=0o700, exist_ok=True)
        shutil.copytree(saved, planted / saved.name)
        for p in (
            [planted.parent, *planted.parent.rglob("*")]
            if not parent_existed
            else [planted, *planted.rglob("*")]
        ):
            os.chown(p, NOBODY, NOBODY)
        again = run([*FERRY, *options, "--", *FUNCTIONS, "--out", str(tmp_path / "run")], env)
        assert again.returncode == 0, again.stderr
        assert f"ferry: resumed from {saved}" in again.stderr, again.stderr
        assert "handed over in host memory" not in again.stderr
        assert f"is owned by uid {NOBODY}, not by this user" in again.stderr
        assert "not used; resuming from the durable checkpoint" in again.stderr
        assert (planted / saved.name).exists()  # another user's folder is left alone
    finally:
        shutil.rmtree(planted if parent_existed else planted.parent, ignore_errors=True)


@root_only
@pytest.mark.parametrize("where", ["home", "jobs", "job"])
def test_ferry_run_refuses_a_job_home_of_another_user(where: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    target = {"home": home, "jobs": home / "jobs", "job": home / "jobs" / "o"}
    for path in list(target.values())[: list(target).index(where) + 1]:
        path.mkdir(mode=0o700)
    os.chown(target[where], NOBODY, NOBODY)
    marker = tmp_path / "started"
    done = run([*FERRY, "--job-id", "o", "--", "touch", str(marker)], env_for(home))
    assert done.returncode == 8, done.stderr
    assert f"is owned by uid {NOBODY}, not by this user" in done.stderr and not marker.exists()
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_ferry_run_refuses_a_symlinked_job_home(tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    (home / "jobs").mkdir(parents=True, mode=0o700)
    elsewhere.mkdir(mode=0o700)
    (home / "jobs" / "s").symlink_to(elsewhere)
    done = run([*FERRY, "--job-id", "s", "--", "true"], env_for(home))
    assert done.returncode == 8 and "is a symbolic link" in done.stderr, done.stderr
    assert list(elsewhere.iterdir()) == []
