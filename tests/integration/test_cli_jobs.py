"""Issue: the operator CLI, ``ferry list``, ``status`` and ``checkpoint``, on real jobs under
real supervisors: a checkpoint with --wait, a checkpoint and stop, the job resumed bitwise;
and a request from another user refused (the client runs as an unprivileged user)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ferry.cli import main
from ferry.runtime.jobdir import JobDir

from trainrun import assert_same, env_for, stderr_of, train_command, wait_for
from trainrun import job_status as status

pytestmark = pytest.mark.integration
EXIT_CHECKPOINTED = 85
FERRY = [sys.executable, "-c", "from ferry.cli import main; main()"]


def start(home: Path, job_id: str, ckpt: Path, command: list[str], *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*FERRY, "run", "--no-autotrack", "--job-id", job_id, "--dir", str(ckpt), *options, "--", *command],
        env=env_for(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def training(path: Path, min_step: int = 3) -> Callable[[], bool]:
    return lambda: status(path).get("state") == "running" and status(path).get("step", 0) >= min_step


def ferry(home: Path, *args: str) -> Result:
    """A ferry command in this process, against the jobs under ``home``."""
    return CliRunner().invoke(main, list(args), env=env_for(home))


def test_checkpoint_wait_then_stop_then_resume_bitwise(tmp_path: Path, reference: Path) -> None:
    home, ckpt, out = tmp_path / "home", tmp_path / "ck", tmp_path / "run"
    path = home / "jobs" / "j"
    command = train_command(out, "--sleep", "0.12")
    proc = start(home, "j", ckpt, command)
    wait_for("training to reach step 3", training(path), proc)

    listed = ferry(home, "list", "--json")
    assert listed.exit_code == 0, listed.output
    doc = json.loads(listed.stdout)
    (job,) = doc["jobs"]
    assert job["id"] == "j" and job["alive"] and job["pid"] == status(path)["worker_pid"]
    assert job["command"] == command
    assert doc["gpu_unavailable"] or isinstance(doc["gpu_processes"], list)
    table = ferry(home, "list")
    assert table.exit_code == 0 and "JOB" in table.stdout and "j " in table.stdout, table.output
    by_pid = ferry(home, "status", str(job["pid"]), "--json")
    assert by_pid.exit_code == 0 and json.loads(by_pid.stdout)["id"] == "j", by_pid.output

    taken = ferry(home, "checkpoint", str(job["pid"]), "--wait", "--timeout", "60", "--json")  # by PID
    assert taken.exit_code == 0, taken.output
    (result,) = json.loads(taken.stdout)["results"]
    assert result["step"] >= 3 and Path(result["url"], "manifest.json").is_file()
    assert proc.poll() is None  # it goes on training

    everyone = ferry(home, "checkpoint", "--all", "--wait", "--timeout", "60", "--json")  # preStop's form
    assert everyone.exit_code == 0, everyone.output
    (second,) = json.loads(everyone.stdout)["results"]
    assert second["job"] == "j" and second["step"] > result["step"]

    detail = json.loads(ferry(home, "status", "j", "--json").stdout)
    saved = detail["status"]["checkpoints"]
    assert [c["step"] for c in saved] == [result["step"], second["step"]] and saved[0]["seconds"] > 0
    human = ferry(home, "status", "j")
    assert "SAVE S" in human.stdout and "save time: mean" in human.stdout, human.output

    stopped = ferry(home, "checkpoint", "j", "--stop", "--wait", "--timeout", "60")
    assert stopped.exit_code == 0, stopped.output
    assert "checkpointed and stopping at step" in stopped.stdout
    proc.communicate(timeout=60)
    assert proc.returncode == EXIT_CHECKPOINTED
    gone = ferry(home, "checkpoint", "j")
    assert gone.exit_code == 8 and "it is not running (checkpointed" in gone.stderr, gone.output

    again = start(home, "j", ckpt, command)  # the same command resumes
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert_same(reference, out)


@pytest.fixture
def open_home() -> Iterator[Path]:
    """A FERRY_HOME that another user may traverse (0711), as a shared machine's /home is."""
    base = Path(tempfile.mkdtemp(prefix="ferry-uid-"))
    base.chmod(0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def as_nobody(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    env = {**env_for(home), "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd="/")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run a client as another user")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_a_request_from_another_user_is_refused(open_home: Path, tmp_path: Path, reference: Path) -> None:
    home, out = open_home, tmp_path / "run"
    path = home / "jobs" / "u"
    # Training holds at the end of step 5 until the test has planted its request, so the
    # next safe point sees it however slow this machine is.
    release = tmp_path / "planted"
    command = train_command(out, "--sleep", "0.05", "--hold-at", "5", "--release", str(release))
    proc = start(home, "u", tmp_path / "ck", command)
    try:
        wait_for("training to start", training(path, min_step=0), proc)

        # The job directory is 0700: the other user's ferry cannot even see the job.
        assert (path.stat().st_mode & 0o777) == 0o700 and ((path / "control").stat().st_mode & 0o777) == 0o700
        refused = as_nobody(home, *FERRY, "checkpoint", "u", "--wait", "--timeout", "10")
        assert refused.returncode == 8, refused
        assert "ferry: error: permission denied" in refused.stderr and "own user" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1

        # Checked, not assumed: with the directories opened up by mistake, the worker itself
        # refuses the request by its file's owner and answers why.
        for p in (home / "jobs", path, path / "control"):
            p.chmod(0o777)
        planted = as_nobody(
            home, sys.executable, "-c",
            "import sys; from ferry.runtime.control import submit; from ferry.runtime.jobdir import JobDir;"
            f"print(submit(JobDir.open({str(path)!r}), 'stop'))",
        )  # fmt: skip
        assert planted.returncode == 0, planted.stderr
        rid = planted.stdout.strip()
        release.touch()
        answer = path / "control" / f"resp-{rid}.json"
        wait_for("the worker's answer", answer.exists, proc)
        doc = json.loads(answer.read_text())
        assert doc["ok"] is False and "refused: request owned by uid 65534" in doc["error"], doc
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err  # it was not stopped, and not checkpointed
        assert JobDir(str(path)).status().get("checkpoints", []) == []
        assert_same(reference, out)
    finally:  # a failed check must not leave the worker held
        release.touch()
        if proc.poll() is None:
            stderr_of(proc)
