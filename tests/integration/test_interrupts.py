"""Issue 13, interrupts: Ctrl-C pressed in a real terminal (a pseudo-terminal whose foreground
process group is ``ferry run``), once and again while the stop's checkpoint is being saved,
checkpoints and exits 85, in explicit and zero-code mode, and the resumed run is exact;
``ferry run`` SIGKILLed does not leave its worker training unsupervised; a checkpoint root
that a live job writes is not given to a second one; ``ferry status`` tells an orphaned
worker from a dead job."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_launcher import FERRY, start

from ferry.cli import main

from reference import reference_run
from trainrun import SCRIPTS, assert_same, env_for, run
from trainrun import job_status as status

pytestmark = pytest.mark.integration
EXIT_CHECKPOINTED = 85
CTRL_C = b"\x03"
CATCHES_KEYBOARD_INTERRUPT = (
    "import runpy, sys\n"
    "sys.argv = sys.argv[1:]\n"
    "if sys.argv[0] == '--ballast':  # 64 MB more state in zero-code mode: a slower save\n"
    "    import torch\n"
    "    ballast = torch.nn.Linear(4096, 4096)\n"
    "    found = torch.optim.SGD(ballast.parameters(), lr=0.0)\n"
    "    sys.argv = sys.argv[1:]\n"
    "try:\n"
    "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "except KeyboardInterrupt:\n"
    "    print('KeyboardInterrupt', 'caught', sep='-', file=sys.stderr)  # not the text of the command\n"
    "    sys.exit(3)\n"
)
"""A script that handles Ctrl-C itself, around the training script it runs (with
``--ballast``: and an unused model and optimizer, whose state makes the save slow enough
to press Ctrl-C again during it; created before the script seeds its generators)."""


def _foreground_terminal() -> None:
    """In the child (a new session): make the pty on fd 0 its controlling terminal, with
    its process group in the foreground, as a shell does for the job it runs."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    os.tcsetpgrp(0, os.getpgrp())


class Terminal:
    """``ferry run`` in the foreground of a pseudo-terminal; ``press`` types into it."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=_foreground_terminal,
        )
        os.close(slave)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:  # drains the terminal: a full one would block the job's writes
        while True:
            try:
                data = os.read(self.master, 4096)
            except OSError:  # EIO: every process of the terminal closed it
                return
            if not data:
                return
            self._chunks.append(data)

    def press(self, keys: bytes) -> None:
        os.write(self.master, keys)

    @property
    def output(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def wait(self, timeout: float = 120) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)
        os.close(self.master)
        return code

    def until(self, what: str, predicate: Callable[[], object], timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.proc.poll() is not None:
                self._reader.join(5)
                raise AssertionError(
                    f"ferry run exited ({self.proc.returncode}) before {what}:\n{self.output}"
                )
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"timed out waiting for {what}:\n{self.output}")
            time.sleep(0.005)


def ctrl_c_twice(tmp_path: Path, options: list[str], command: list[str]) -> Terminal:
    """Run ``command`` under ``ferry run`` in a terminal; once it trains, press Ctrl-C, and
    again while the stop's checkpoint is being saved."""
    job = tmp_path / "home" / "jobs" / "t"
    term = Terminal([*FERRY, "--job-id", "t", "--dir", str(tmp_path / "ck"), *options, "--", *command],
                    env_for(tmp_path / "home"))  # fmt: skip
    term.until("training", lambda: status(job).get("state") == "running" and status(job).get("step", 0) >= 3)
    term.press(CTRL_C)
    term.until("the stop's save", lambda: status(job).get("state") == "checkpointing")
    term.press(CTRL_C)
    return term


def test_ctrl_c_twice_in_explicit_mode_checkpoints_and_resumes_exactly(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The script catches KeyboardInterrupt itself (and would exit 3): there must be none."""
    reference = reference_run(tmp_path_factory)
    out = tmp_path / "run"
    train = [str(SCRIPTS / "train_explicit.py"), "--out", str(out)]
    command = [
        sys.executable,
        "-c",
        CATCHES_KEYBOARD_INTERRUPT,
        *train,
        "--sleep",
        "0.05",
        "--state-mb",
        "48",
    ]
    term = ctrl_c_twice(tmp_path, ["--no-autotrack"], command)
    code = term.wait()
    text = term.output
    assert code == EXIT_CHECKPOINTED, text
    assert "SIGINT: asked the worker to checkpoint at its next safe point and stop" in text, text
    assert "SIGINT again: the worker is already stopping" in text, text
    assert "KeyboardInterrupt-caught" not in text and "Traceback" not in text, text
    assert "exiting with 85" in text and "checkpointed on SIGINT" in text, text
    doc = status(tmp_path / "home" / "jobs" / "t")
    assert doc["state"] == "checkpointed" and doc["exit_code"] == EXIT_CHECKPOINTED, doc

    options = ["--job-id", "t", "--dir", str(tmp_path / "ck"), "--no-autotrack"]
    again = subprocess.run(
        [*FERRY, *options, "--", sys.executable, *train],
        env=env_for(tmp_path / "home"), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "ferry: resumed from" in again.stderr
    assert_same(reference, out)


def test_ctrl_c_twice_in_zero_code_mode_checkpoints_and_resumes_exactly(tmp_path: Path) -> None:
    """Unmodified, and catching KeyboardInterrupt: it must see none."""
    script = [sys.executable, "-c", CATCHES_KEYBOARD_INTERRUPT, "--ballast", str(SCRIPTS / "zc_steps.py")]
    plain = run("zc_steps.py", tmp_path / "ref", [], env_for(tmp_path / "home-ref"))
    assert plain.returncode == 0, plain.stderr
    out = tmp_path / "run"
    term = ctrl_c_twice(tmp_path, [], [*script, "--out", str(out), "--sleep", "0.05"])
    code = term.wait()
    text = term.output
    assert code == EXIT_CHECKPOINTED, text
    assert "SIGINT again: the worker is already stopping" in text, text
    assert "KeyboardInterrupt-caught" not in text and "Traceback" not in text, text

    again = subprocess.run(
        [*FERRY, "--job-id", "t", "--dir", str(tmp_path / "ck"), "--", *script, "--out", str(out)],
        env=env_for(tmp_path / "home"), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "resumed from" in again.stderr
    steps = {}
    for line in (out / "log.txt").read_text().splitlines():  # the last line written for each step
        steps[line.split(" ", 1)[0]] = line
    reference = {
        line.split(" ", 1)[0]: line for line in (tmp_path / "ref" / "log.txt").read_text().splitlines()
    }
    assert steps == reference
    assert (out / "params.txt").read_text() == (tmp_path / "ref" / "params.txt").read_text()


def until(what: str, predicate: Callable[[], object], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_killed_supervisor_makes_its_worker_checkpoint_and_stop(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    reference = reference_run(tmp_path_factory)
    out, job = tmp_path / "run", tmp_path / "jobs" / "k"
    train = [sys.executable, str(SCRIPTS / "train_explicit.py"), "--out", str(out)]
    options = ["--no-autotrack", "--job-id", "k", "--dir", str(tmp_path / "ck")]
    proc = start(options, [*train, "--sleep", "0.05"], tmp_path)
    until("training", lambda: status(job).get("state") == "running" and status(job).get("step", 0) >= 3)
    worker = status(job)["worker_pid"]
    proc.kill()
    proc.communicate(timeout=30)
    until("the worker to stop", lambda: gone(worker), timeout=60)
    doc = status(job)
    assert doc["state"] == "checkpointed" and doc["step"] < 36, doc  # not trained on to the end

    again = subprocess.run([*FERRY, *options, "--", *train], env=env_for(tmp_path), capture_output=True,
                           text=True, timeout=180)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "ferry: resumed from" in again.stderr
    assert_same(reference, out)


def job_state(home: Path, job_id: str) -> str:
    result = CliRunner().invoke(main, ["status", job_id, "--json"], env={"FERRY_HOME": str(home)})
    assert result.exit_code == 0, result.output
    return str(json.loads(result.stdout)["state"])


def test_an_orphaned_worker_keeps_the_job_and_its_root_and_is_shown_as_such(tmp_path: Path) -> None:
    """A worker that ignores the supervisor's death (it ignores SIGTERM) still holds the job's
    lock and its checkpoint root's: ``ferry status`` says orphaned, and no second job can
    take its checkpoint root; once it is gone, the job is dead and the root free."""
    out = tmp_path / "out"
    out.mkdir()
    ck = tmp_path / "ck"
    stubborn = [sys.executable, str(SCRIPTS / "launcher_stubborn.py"), str(out)]
    proc = start(["--no-autotrack", "--job-id", "o", "--dir", str(ck)], stubborn, tmp_path)
    until("the worker", lambda: (out / "ready").exists() and (out / "ready").read_text())
    assert job_state(tmp_path, "o") == "starting"  # a plain command: no session reports more
    second = start(["--no-autotrack", "--job-id", "other", "--dir", str(ck)], ["true"], tmp_path)
    _, err = second.communicate(timeout=60)
    assert second.returncode == 8, err
    assert f"the checkpoint root {ck} is being written by the live job o" in err, err

    proc.kill()
    proc.wait(30)  # not communicate: the orphan holds the pipes open
    worker = int((out / "ready").read_text())
    try:
        assert not gone(worker)
        assert job_state(tmp_path, "o") == "orphaned"
        again = start(["--no-autotrack", "--job-id", "other", "--dir", str(ck)], ["true"], tmp_path)
        _, err = again.communicate(timeout=60)
        assert again.returncode == 8 and "live job o" in err, err
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)
    until("the orphan to die", lambda: gone(worker))
    assert job_state(tmp_path, "o") == "dead"
    free = start(["--no-autotrack", "--job-id", "other", "--dir", str(ck)], ["true"], tmp_path)
    _, err = free.communicate(timeout=60)
    assert free.returncode == 0, err


def test_a_stop_the_script_never_reaches_a_safe_point_for_is_said_truthfully(tmp_path: Path) -> None:
    """The stop signal comes after the last safe point: the script ends (exit 0) without a
    checkpoint from it, and the worker says so instead of staying silent."""
    script = (
        "import os, signal, ferry\n"
        "ferry.track(state={'a': 1})\n"
        "ferry.step()\n"
        "os.kill(os.getpid(), signal.SIGUSR1)  # after the loop: no safe point follows\n"
    )
    env = env_for(tmp_path / "home", FERRY_DIR=str(tmp_path / "ck"))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert (
        "ferry: SIGUSR1 asked for a checkpoint and stop, but the script reached no safe point" in done.stderr
    )
    assert "ended at step 1 without one" in done.stderr, done.stderr
