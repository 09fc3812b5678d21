"""Issue 16, progress of a save: while a checkpoint save runs over a second, the worker
publishes its bytes in the job's status (``saving``); ``ferry status`` shows it, and
``ferry checkpoint --wait`` draws it as a live line on a terminal, and stays silent in a
pipe. The save is held half-written (scripts/slow_save.py) until the test has seen what it
looks for: no race against the wall clock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from forked import Forked
from test_cli_jobs import EXIT_CHECKPOINTED, ferry
from trainrun import SCRIPTS, env_for, job_status

pytestmark = pytest.mark.integration
FERRY = [sys.executable, "-c", "from ferry.cli import main; main()"]
HALF = "16.0 MiB of 32.0 MiB, 49%"  # the data file holds a few KiB beyond the tensor


def until(
    what: str, predicate: Callable[[], Any], job: Forked, seen: Callable[[], str] = str, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert job.poll() is None, f"the job exited ({job.returncode}) before {what}: {seen()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {seen()}"
        time.sleep(0.02)


class Terminal:
    """``ferry ARGS`` with stdout and stderr on a pseudo-terminal; what it wrote so far."""

    def __init__(self, home: Path, *args: str) -> None:
        master, slave = os.openpty()
        self.proc = subprocess.Popen(
            [*FERRY, *args], env=env_for(home), stdin=subprocess.DEVNULL, stdout=slave, stderr=slave
        )
        os.close(slave)
        self.chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, args=(master,), daemon=True)
        self._reader.start()

    def _read(self, master: int) -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the command closed the terminal
                break
            if not data:
                break
            self.chunks.append(data)
        os.close(master)

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

    def finish(self) -> str:
        assert self.proc.wait(60) == 0, self.text
        self._reader.join(10)
        return self.text


def test_a_long_save_shows_its_progress(tmp_path: Path) -> None:
    home, hold = tmp_path / "home", tmp_path / "hold"
    path = home / "jobs" / "s"
    hold.touch()
    env = env_for(home, FERRY_JOB_ID="s", FERRY_DIR=str(tmp_path / "ck"))
    job = Forked([str(SCRIPTS / "slow_save.py"), "--hold", str(hold)], env=env)
    try:
        until("training", lambda: job_status(path).get("step", 0) >= 2, job)

        # On a terminal: the line, from the bytes the worker published, to the commit.
        term = Terminal(home, "checkpoint", "s", "--wait", "--timeout", "60")
        until(
            "the live line of the held save",
            lambda: HALF in term.text,
            job,
            lambda: f"{term.text!r} {job_status(path)}",
        )
        shown = ferry(home, "status", "s")
        assert shown.exit_code == 0, shown.output
        assert "saving       step " in shown.stdout and "16.00 MiB of 32.0" in shown.stdout, shown.stdout
        doc = json.loads(ferry(home, "status", "s", "--json").stdout)["saving"]
        assert (
            doc["bytes"] == 16 << 20 and 32 << 20 < doc["total"] < 33 << 20 and doc["bytes_per_second"] > 0
        ), doc
        hold.unlink()
        out = term.finish()
        step = doc["step"]
        assert f"\rferry: saving step {step}: {HALF}, " in out and "MiB/s" in out, out
        assert "32.0 MiB of 32.0 MiB, 100%" in out and f"s: checkpointed at step {step} in " in out, out
        until("the field removed once the save ended", lambda: "saving" not in job_status(path), job)

        # In a pipe (here, click's runner): the same wait draws nothing.
        hold.touch()
        piped: list[Result] = []
        waiter = threading.Thread(target=lambda: piped.append(ferry(home, "checkpoint", "s", "--wait")))
        waiter.start()
        rewrites: set[int] = set()  # status.json is replaced at each publication: a new inode

        def published_twice() -> bool:
            saving = job_status(path).get("saving")
            if saving is not None and saving["step"] > step and saving["bytes"] == 16 << 20:
                rewrites.add(os.stat(path / "status.json").st_ino)
            return len(rewrites) >= 2

        until("the held save published twice", published_twice, job)
        hold.unlink()
        waiter.join(60)
        (result,) = piped
        assert result.exit_code == 0, result.output
        assert "\r" not in result.output and "MiB of" not in result.output, result.output
        assert "s: checkpointed at step " in result.stdout

        stopped = ferry(home, "stop", "s")
        assert stopped.exit_code == 0, stopped.output
        assert job.wait(60) == EXIT_CHECKPOINTED
    finally:
        hold.unlink(missing_ok=True)
        if job.poll() is None:
            job.kill()
