"""Issue: ``ferry run``, the supervisor. Real supervisors, real workers, real signals: the
job finishes, stops on a signal and resumes bitwise, forwards every signal to the worker's
whole process tree, SIGKILLs a worker that overstays its grace, restarts a crashed worker
from its checkpoint, restarts in place with another environment, and refuses what cannot run."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ferry.cli import main
from ferry.runtime.control import submit
from ferry.runtime.jobdir import JobDir

from trainrun import SCRIPTS, assert_same, env_for, train_command, wait_for
from trainrun import job_status as status

pytestmark = pytest.mark.integration
EXIT_CHECKPOINTED = 85
FERRY = [sys.executable, "-c", "from ferry.cli import main; main()", "run"]


def start(options: list[str], command: list[str], home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*FERRY, *options, "--", *command],
        env=env_for(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def ferry_run(options: list[str], command: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    """``ferry run`` in a process of its own."""
    proc = start(options, command, home)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def state(pid: int) -> str:
    """A process's state letter: S sleeping, R running, T stopped."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def training(job: Path, min_step: int = 3) -> Callable[[], bool]:
    return lambda: status(job).get("state") == "running" and status(job).get("step", 0) >= min_step


def invoke(*args: str) -> Result:
    """``ferry run ARGS`` in this process (with the ``here`` fixture): cheaper, as long as
    the test has no signal to send to the supervisor."""
    return CliRunner().invoke(main, ["run", *args])


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> Path:
    """For supervisors run in this process (``invoke``): the environment ``env_for`` gives
    subprocesses, and the supervisor's log in ``caplog``. Returns FERRY_HOME."""
    for key in os.environ:
        if key.startswith("FERRY_"):
            monkeypatch.delenv(key)
    for key, value in env_for(tmp_path).items():
        monkeypatch.setenv(key, value)
    caplog.set_level(logging.INFO, logger="ferry.run")
    return tmp_path


def test_finished_run_exits_0(here: Path, tmp_path: Path, reference: Path) -> None:
    result = invoke(
        "--no-autotrack",
        "--job-id",
        "a",
        "--dir",
        str(tmp_path / "ck"),
        "--",
        *train_command(tmp_path / "run"),
    )
    assert result.exit_code == 0, result.output
    job = tmp_path / "jobs" / "a"
    doc = status(job)
    assert doc["state"] == "finished" and doc["exit_code"] == 0, doc
    identity = json.loads((job / "job.json").read_text())
    assert (
        identity["id"] == "a"
        and identity["checkpoint_dir"] == str(tmp_path / "ck")
        and identity["cwd"] == os.getcwd()
    )
    assert identity["worker_pid"] == doc["worker_pid"] != identity["supervisor_pid"]
    assert not JobDir(str(job)).is_locked()
    assert_same(reference, tmp_path / "run")


def test_sigterm_to_the_supervisor_checkpoints_then_resumes_bitwise(tmp_path: Path, reference: Path) -> None:
    options = ["--no-autotrack", "--job-id", "b", "--dir", str(tmp_path / "ck")]
    job = tmp_path / "jobs" / "b"
    proc = start(options, train_command(tmp_path / "run", "--sleep", "0.05"), tmp_path)
    wait_for("training to reach step 3", training(job), proc)
    assert JobDir(str(job)).is_locked()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_CHECKPOINTED, err
    assert (
        "SIGTERM: asked the worker to checkpoint at its next safe point and stop" in err
        and "exiting with 85" in err
    )
    doc = status(job)
    assert doc["state"] == "checkpointed" and doc["exit_code"] == EXIT_CHECKPOINTED, doc
    assert not JobDir(str(job)).is_locked()

    again = ferry_run(options, train_command(tmp_path / "run"), tmp_path)
    assert again.returncode == 0, again.stderr
    assert "ferry: resumed from" in again.stderr
    assert status(job)["state"] == "finished"
    assert_same(reference, tmp_path / "run")


def test_every_signal_reaches_the_whole_process_tree(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = start(["--no-autotrack", "--job-id", "c"], [sys.executable, str(SCRIPTS / "launcher_tree.py"),
                                                        "--out", str(out)], tmp_path)  # fmt: skip
    wait_for(
        "parent and child", lambda: (out / "parent.ready").exists() and (out / "child.ready").exists(), proc
    )
    sent = ["SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR2", "SIGWINCH", "SIGCONT", "SIGALRM", "SIGRTMIN+1"]
    for name in sent:
        proc.send_signal(signal.SIGRTMIN + 1 if name == "SIGRTMIN+1" else getattr(signal, name))
        time.sleep(0.05)  # standard signals do not queue: one of each at a time

    def recorded(role: str) -> set[str]:
        path = out / f"{role}.txt"
        return set(path.read_text().split()) if path.exists() else set()

    wait_for("every signal in both", lambda: recorded("parent") >= set(sent) <= recorded("child"), proc)
    # ^Z: the supervisor stops the worker's group, then itself; SIGCONT brings both back
    tree = [proc.pid, *(int((out / f"{role}.ready").read_text()) for role in ("parent", "child"))]
    proc.send_signal(signal.SIGTSTP)
    wait_for("the whole tree to stop", lambda: all(state(pid) == "T" for pid in tree), proc)
    proc.send_signal(signal.SIGCONT)
    wait_for("the whole tree to go on", lambda: all(state(pid) in "SR" for pid in tree), proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert recorded("parent") == recorded("child") == {*sent, "SIGTERM"}


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace(here: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    options = ["--no-autotrack", "--job-id", "d", "--grace", "1"]
    proc = start(options, [sys.executable, str(SCRIPTS / "launcher_stubborn.py"), str(out)], tmp_path)
    wait_for("the worker", lambda: (out / "ready").exists(), proc)
    second = invoke(*options, "--", "true")  # the same job id, while it runs (here)
    assert second.exit_code == 8 and "already running" in second.stderr, second.output
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert 0.9 < time.monotonic() - started < 10
    assert "did not exit within 1 s of SIGTERM (it reached no safe point after the signal" in err
    assert "killing its process group with SIGKILL; this stop leaves no new checkpoint" in err
    doc = status(tmp_path / "jobs" / "d")
    assert doc["state"] == "failed" and doc["exit_code"] == 137 and "SIGKILL" in doc["error"], doc
    worker = int((out / "ready").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)


def test_a_crashed_worker_restarts_from_its_checkpoint(
    here: Path,
    tmp_path: Path,
    reference: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    marker = tmp_path / "crashed-once"
    command = [sys.executable, str(SCRIPTS / "launcher_wrap.py"), "--crash-once", f"{marker}=23",
               "--out", str(tmp_path / "run")]  # fmt: skip
    options = ["--no-autotrack", "--job-id", "e", "--dir", str(tmp_path / "ck"), "--every-steps", "5",
               "--max-failures", "2", "--backoff", "0.1"]  # fmt: skip
    result = invoke(*options, "--", *command)
    worker_stderr = capfd.readouterr().err
    assert result.exit_code == 0, worker_stderr
    assert marker.exists()
    assert "the worker was killed by SIGKILL: failure 1 of 2 allowed" in caplog.text
    assert "ferry: resumed from" in worker_stderr
    job = JobDir(str(tmp_path / "jobs" / "e"))
    restarts = [e for e in job.events() if e["event"] == "restart"]
    assert [(e["reason"], e["returncode"]) for e in restarts] == [("failure", -signal.SIGKILL)]
    assert job.status()["state"] == "finished" and job.status()["failures"] == 1
    assert_same(reference, tmp_path / "run")


def test_restart_in_place_applies_the_requested_env(tmp_path: Path, reference: Path) -> None:
    seen = tmp_path / "seen.txt"
    command = [sys.executable, str(SCRIPTS / "launcher_wrap.py"), "--record-env", f"FERRY_TEST_MARK={seen}",
               "--out", str(tmp_path / "run"), "--sleep", "0.05"]  # fmt: skip
    options = ["--no-autotrack", "--job-id", "f", "--dir", str(tmp_path / "ck"), "--max-restarts", "1",
               "--env", "FERRY_TEST_MARK=1"]  # fmt: skip
    path = tmp_path / "jobs" / "f"
    proc = start(options, command, tmp_path)
    wait_for("training to reach step 3", training(path), proc)
    first_worker = status(path)["worker_pid"]
    submit(JobDir.open(str(path)), "restart", env={"FERRY_TEST_MARK": "2"})
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    assert seen.read_text().split() == ["1", "2"]
    assert "restarting the worker in place (1 of 1) with FERRY_TEST_MARK=2" in err
    assert "was handed over in host memory" in err  # the restart did not read the disk back
    job = JobDir(str(path))
    (restart,) = [e for e in job.events() if e["event"] == "restart"]
    assert restart["reason"] == "requested" and restart["env"] == {"FERRY_TEST_MARK": "2"}
    assert 0 < restart["downtime_seconds"] < 30 and restart["pid"] != first_worker
    doc = job.status()
    assert doc["state"] == "finished" and doc["restarts"] == 1 and doc["restart"] is None, doc
    assert_same(reference, tmp_path / "run")


def test_commands_that_cannot_run_are_refused(here: Path, tmp_path: Path) -> None:
    """Nothing gets to start: a clear one-line error, exit 2, nothing locked."""
    missing = invoke("--job-id", "g")
    assert missing.exit_code == 2 and "no command given" in missing.stderr, missing.output
    absent = invoke("--job-id", "g", "--", "ferry-no-such-program")
    assert absent.exit_code == 2 and "command not found" in absent.stderr, absent.output
    assert not (tmp_path / "jobs" / "g").exists()
    plain = tmp_path / "plain.txt"
    plain.write_text("not a program\n")
    refused = invoke("--job-id", "g", "--", str(plain))
    assert refused.exit_code == 2 and "not executable" in refused.stderr, refused.output
    garbage = tmp_path / "garbage"  # an executable bit, but no format the kernel can exec
    garbage.write_bytes(b"\x00\x01\x02\x03")
    garbage.chmod(0o755)
    failed = invoke("--job-id", "g", "--", str(garbage))
    assert failed.exit_code == 2, failed.output
    assert failed.stderr.startswith("ferry: error: cannot run") and failed.stderr.count("\n") == 1
    job = JobDir(str(tmp_path / "jobs" / "g"))
    assert not job.is_locked() and job.status()["state"] == "failed"
    typo = invoke("--evry-steps", "3", "python")  # an unknown option becomes the command
    assert typo.exit_code == 2 and "an unknown option?" in typo.stderr, typo.output
    bad = invoke("--every-steps", "0", "--", "true")
    assert bad.exit_code == 2 and "'--every-steps': 0: must be a whole number of steps" in bad.stderr
    # A bad FERRY_* setting for the worker is refused before it starts, not in the worker.
    env = invoke("--job-id", "h", "--env", "FERRY_KEEP_LAST=three", "--", "true")
    assert env.exit_code == 2 and "FERRY_KEEP_LAST='three' is not a whole number" in env.stderr, env.output
    assert not (tmp_path / "jobs" / "h").exists()


def test_plain_commands_exit_codes_and_failures(here: Path, tmp_path: Path) -> None:
    """Plain shell commands as workers: the exit-code rules alone."""
    fails = invoke("--no-autotrack", "--job-id", "h1", "--", "sh", "-c", "exit 3")
    assert fails.exit_code == 3, fails.output
    doc = status(tmp_path / "jobs" / "h1")
    assert doc["state"] == "failed" and doc["exit_code"] == 3 and "exited with 3" in doc["error"], doc

    marker = tmp_path / "failed-once"
    once = f"test -e '{marker}' || {{ touch '{marker}'; kill -9 $$; }}"
    retried = invoke("--no-autotrack", "--job-id", "h2", "--max-failures", "1", "--backoff", "0", "--",
                     "sh", "-c", once)  # fmt: skip
    assert retried.exit_code == 0, retried.output
    job = JobDir(str(tmp_path / "jobs" / "h2"))
    assert [(e["event"], e.get("returncode")) for e in job.events() if "worker" in e["event"]] == [
        ("worker_start", None), ("worker_exit", -9), ("worker_start", None), ("worker_exit", 0)
    ]  # fmt: skip
    assert job.status()["state"] == "finished" and job.status()["failures"] == 1

    stopped = invoke("--no-autotrack", "--job-id", "h3", "--max-restarts", "1", "--", "sh", "-c", "exit 85")
    assert stopped.exit_code == EXIT_CHECKPOINTED, stopped.output  # no restart was asked for
    assert status(tmp_path / "jobs" / "h3")["state"] == "checkpointed"
