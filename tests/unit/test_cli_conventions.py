"""Issue: the verbs users type and the answers they read. Aliases (ls, ps, stop), "did you
mean", ``--json`` errors on stdout with their exit code, job ids in natural order, HOST and
START columns, ages right in every time zone, ``ferry prune`` on real job directories, and
hints that say what is true (resume sources, missing paths and scripts, a worker with no
ferry session). Jobs here are real ``ferry run`` supervisors of commands without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

from ferry.cli import main
from ferry.cli.output import ago
from ferry.engine import list_checkpoints, save
from ferry.ops.bundle import relevant_env, resume_command
from ferry.ops.jobs import natural_key
from ferry.ops.prune import Candidate, parse_age, select
from ferry.runtime.jobdir import JobDir
from ferry.storage import open_storage

FERRY = [sys.executable, "-c", "from ferry.cli import main; main()"]


def env_for(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    return {**env, "FERRY_HOME": str(home), **extra}


def ferry(home: Path, *args: str) -> Result:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("FERRY_")}
    return CliRunner().invoke(main, list(args), env={**env, "FERRY_HOME": str(home)})


def run_job(home: Path, job: str, ckpt: Path, *command: str) -> subprocess.CompletedProcess[str]:
    cmd = [*FERRY, "run", "--no-autotrack", "--job-id", job, "--dir", str(ckpt), "--", *command]
    return subprocess.run(cmd, env=env_for(home), capture_output=True, text=True, timeout=60)


# ------------------------------------------------------------------ pure pieces, from tables


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(-2.0, "just now"), (0.4, "just now"), (3.2, "3 s ago"), (59, "59 s ago"), (61, "1 min ago"),
     (7200, "2 h ago"), (3 * 86400 + 5, "3 d ago")],
)  # fmt: skip
def test_ago(seconds: float, text: str) -> None:
    assert ago(seconds) == text


def test_natural_order() -> None:
    ids = ["job10", "job2", "a", "job1", "b-3", "b-20"]
    assert sorted(ids, key=natural_key) == ["a", "b-3", "b-20", "job1", "job2", "job10"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("45s", 45), ("10", 10), ("2w", 1209600)],
)
def test_parse_age(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


NOW = 1_000_000.0


@pytest.mark.parametrize(
    ("job", "pruned"),
    [
        (Candidate(id="old-finished", alive=False, state="finished", ended=NOW - 900), True),
        (Candidate(id="old-failed", alive=False, state="failed", ended=NOW - 900), True),
        (Candidate(id="old-checkpointed", alive=False, state="checkpointed", ended=NOW - 900), True),
        (Candidate(id="recent", alive=False, state="finished", ended=NOW - 10), False),
        (Candidate(id="live", alive=True, state="finished", ended=NOW - 900), False),
        (Candidate(id="running", alive=True, state="running", ended=NOW - 900), False),
        (Candidate(id="dead", alive=False, state="dead", ended=NOW - 900), False),
        (Candidate(id="no-end", alive=False, state="finished", ended=None), False),
    ],
    ids=lambda v: v.id if isinstance(v, Candidate) else str(v),
)
def test_select(job: Candidate, pruned: bool) -> None:
    assert select([job], older_than=600, now=NOW) == ([job.id] if pruned else [])


def test_a_bundle_carries_no_variable_of_the_old_job() -> None:
    env = {"FERRY_HANDOFF_DIR": "/dev/shm/x", "FERRY_SUPERVISOR_PID": "12", "FERRY_EVERY_STEPS": "5"}
    assert relevant_env(env) == {"FERRY_EVERY_STEPS": "5"}


def test_the_resume_command_names_the_new_root() -> None:
    line = resume_command(
        job_id="r1", checkpoint_dir="/ck/r 1", command=["python", "t.py"], env={"FERRY_EVERY_STEPS": "5"},
        cwd="/w", autotrack=False, max_restarts=1,
    )  # fmt: skip
    assert line == (
        "cd /w && ferry run --job-id r1 --dir '/ck/r 1' --max-restarts 1 --no-autotrack "
        "--env FERRY_EVERY_STEPS=5 -- python t.py"
    )


# ------------------------------------------------------------------ commands


def test_aliases_did_you_mean_and_json_errors(tmp_path: Path) -> None:
    listed = ferry(tmp_path, "list", "--json")
    for alias in ("ls", "ps"):
        result = ferry(tmp_path, alias, "--json")
        assert (
            result.exit_code == 0 and json.loads(result.stdout)["jobs"] == json.loads(listed.stdout)["jobs"]
        )
    typo = ferry(tmp_path, "statsu", "x")
    assert typo.exit_code == 2 and "Did you mean 'status'?" in typo.stderr
    for args, code, words in (
        (["statsu", "--json"], 2, "Did you mean 'status'"),
        (["status", "nope", "--json"], 8, "no ferry job 'nope'"),
        (["checkpoint", "--json"], 2, "either JOB or --all"),
        (["stop", "nope", "--json"], 8, "no ferry job 'nope'"),
        (["inspect", str(tmp_path / "missing"), "--json"], 4, "does not exist"),
        (["prune", "--older-than", "soon", "--json"], 2, "is not an age"),
        (["status", "--json"], 2, "Missing argument 'JOB'"),
    ):
        result = ferry(tmp_path, *args)
        assert result.exit_code == code, result.output
        doc = json.loads(result.stdout)
        assert doc["exit"] == code and words in doc["error"], doc
        assert result.stderr == "", result.stderr


def test_list_columns_and_natural_order_of_real_jobs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for job in ("job10", "job2", "job1"):
        assert run_job(home, job, tmp_path / job, "true").returncode == 0
    doc = json.loads(ferry(home, "list", "--all", "--json").stdout)
    assert [j["id"] for j in doc["jobs"]] == ["job1", "job2", "job10"]
    assert all(j["host"] and j["started"] for j in doc["jobs"])
    lines = ferry(home, "ls", "--all").stdout.splitlines()
    assert lines[0].split()[:5] == ["JOB", "HOST", "PID", "STATE", "START"]
    assert [line.split()[0] for line in lines[1:4]] == ["job1", "job2", "job10"]


def test_inspect_ages_in_every_time_zone(tmp_path: Path) -> None:
    save({"w": torch.zeros(2)}, str(tmp_path / "ck"), step=1)
    for tz in ("UTC", "America/New_York", "Asia/Kolkata", "Pacific/Chatham"):
        env = {**os.environ, "TZ": tz}
        out = subprocess.run(
            [*FERRY, "inspect", str(tmp_path / "ck")], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        assert "just now" in out.stdout or " s ago)" in out.stdout, (tz, out.stdout)
        age = out.stdout.split("(")[1].split(")")[0]
        assert age == "just now" or 0 < int(age.split()[0]) < 60, (tz, age)


def test_prune_real_job_directories(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for job in ("done", "crashed", "shares"):
        ckpt = tmp_path / ("shared" if job == "shares" else f"ck-{job}")
        run_job(home, job, ckpt, "true" if job != "crashed" else "false")
        save({"w": torch.zeros(2)}, str(ckpt), step=3)
    # a live job (its supervisor's lock held by this test, its worker a real process) and one
    # that died without a word: neither may go
    live = JobDir.create("live", str(home / "jobs" / "live"))
    live.acquire_lock()
    sleeper = subprocess.Popen(["sleep", "60"])
    live.write_identity(
        id="live", supervisor_pid=os.getpid(), worker_pid=sleeper.pid, checkpoint_dir=str(tmp_path / "shared")
    )
    live.update_status("finished", ended=time.time() - 10**6)
    dead = JobDir.create("dead", str(home / "jobs" / "dead"))
    dead.write_identity(id="dead", worker_pid=2**22 + 7)
    dead.update_status("running", step=3)
    time.sleep(1.1)
    try:
        dry = ferry(home, "prune", "--older-than", "1s", "--checkpoints", "--dry-run", "--json")
        assert dry.exit_code == 0, dry.output
        would = {p["id"]: p for p in json.loads(dry.stdout)["pruned"]}
        assert set(would) == {"done", "crashed", "shares"}
        assert len(would["done"]["checkpoints_removed"]) == 1
        assert would["shares"]["checkpoints_kept_because"] and not would["shares"]["checkpoints_removed"]
        assert sorted(os.listdir(home / "jobs")) == ["crashed", "dead", "done", "live", "shares"]
        young = ferry(home, "prune", "--older-than", "1h")
        assert young.exit_code == 0 and "no ended job older than 1h" in young.stdout
        done = ferry(home, "prune", "--older-than", "1s", "--checkpoints")
        assert done.exit_code == 0, done.output
        assert "deleted job done" in done.stdout and "deleted checkpoint" in done.stdout
        assert sorted(os.listdir(home / "jobs")) == ["dead", "live"]
        assert not (tmp_path / "ck-done").exists()  # its checkpoints went, and the empty root
        assert len(list_checkpoints(open_storage(str(tmp_path / "shared")))) == 1  # shared: kept
    finally:
        live.release_lock()
        sleeper.kill()
        sleeper.wait()


def test_hints_that_are_right(tmp_path: Path) -> None:
    home = tmp_path / "home"
    empty = tmp_path / "empty"
    empty.mkdir()
    result = ferry(home, "resume", str(empty))
    assert result.exit_code == 4 and "holds neither a bundle" in result.stderr, result.output
    assert "is a checkpoint" not in result.stderr
    result = ferry(home, "resume", str(tmp_path / "nowhere"), "--", "true")
    assert result.exit_code == 4 and "does not exist" in result.stderr, result.output
    result = ferry(home, "inspect", str(tmp_path / "nowhere"))
    assert "does not exist" in result.stderr and "no committed checkpoint" not in result.stderr
    missing = run_job(home, "m", tmp_path / "ck", sys.executable, str(tmp_path / "train.py"))
    assert missing.returncode == 2 and "no such script" in missing.stderr, missing.stderr
    assert "--max-failures" not in missing.stderr


def test_checkpoint_wait_on_a_worker_without_a_ferry_session(tmp_path: Path) -> None:
    home = tmp_path / "home"
    cmd = [
        *FERRY,
        "run",
        "--no-autotrack",
        "--job-id",
        "s",
        "--dir",
        str(tmp_path / "ck"),
        "--",
        "sleep",
        "30",
    ]
    proc = subprocess.Popen(cmd, env=env_for(home), stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while JobDir(str(home / "jobs" / "s")).status().get("worker_pid") is None:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        result = ferry(home, "checkpoint", "s", "--wait", "--timeout", "1")
        assert result.exit_code == 8, result.output
        assert "has not started a ferry session" in result.stderr, result.stderr
        assert "a long step delays" not in result.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_resume_hint_passes_what_ferry_run_sets_itself_as_options_not_env() -> None:
    """A bundle's environment holds the worker's FERRY_* settings, some of which ferry run
    sets itself and refuses through --env: the printed command must run as printed."""
    from ferry.ops.bundle import resume_command
    from ferry.supervisor.options import SUPERVISOR_OWNED

    env = {key: "x" for key in SUPERVISOR_OWNED} | {"FERRY_EXIT_CODE": "77", "FERRY_EVERY_STEPS": "5"}
    line = resume_command(
        job_id="j", checkpoint_dir="/ck", command=["python", "t.py"], env=env, cwd=None,
        autotrack=True, max_restarts=0,
    )  # fmt: skip
    assert "--exit-code 77" in line and "--env FERRY_EVERY_STEPS=5" in line
    assert not any(f"--env {key}=" in line for key in SUPERVISOR_OWNED), line


@pytest.mark.parametrize(
    "argv",
    [
        ["checkpoint", "j", "--wait", "--timeout", "nan"],
        ["stop", "j", "--timeout", "-1"],
        ["chaos", "--duration", "nan", "--", "true"],
        ["chaos", "--pause", "0.1", "nan", "--", "true"],
    ],
    ids=["checkpoint-nan", "stop-negative", "chaos-duration-nan", "chaos-pause-nan"],
)
def test_every_duration_option_refuses_what_is_not_a_duration(argv: list[str]) -> None:
    """nan or inf would silently turn a wait into "never" or "at once": a usage error (exit 2)."""
    from click.testing import CliRunner

    from ferry.cli import main

    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2, result.output
    assert "number of seconds" in result.output, result.output
