"""Issue 16: commands that cooperate. A preemption hook's ``ferry checkpoint --all --wait``
and a ``--stop --wait`` that land while a slow periodic save is in flight (job state
``checkpointing``) queue behind it instead of being refused, and the job still resumes
bitwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_cli_jobs import EXIT_CHECKPOINTED, ferry, start, status, wait_for
from trainrun import assert_same, train_command

pytestmark = pytest.mark.integration


def saving(path: Path, after: int = 0) -> bool:
    """A periodic save of a step past ``after`` is in flight."""
    doc = status(path)
    return doc.get("state") == "checkpointing" and doc.get("step", 0) > after


def test_requests_during_a_periodic_save_queue_behind_it(tmp_path: Path, reference: Path) -> None:
    home, ck, out = tmp_path / "home", tmp_path / "ck", tmp_path / "run"
    path = home / "jobs" / "c"
    command = train_command(out, "--sleep", "0.05", "--state-mb", "256")  # saves of 256 MiB: slow
    proc = start(home, "c", ck, command, "--every-steps", "4", "--keep-last", "1")
    wait_for("a periodic save in flight", lambda: saving(path), proc, timeout=90)
    busy_at = status(path)["step"]
    everyone = ferry(home, "checkpoint", "--all", "--wait", "--timeout", "60", "--json")  # preStop's form
    assert everyone.exit_code == 0, everyone.output
    doc = json.loads(everyone.stdout)
    assert doc["errors"] == [] and doc["results"][0]["step"] >= busy_at, doc

    wait_for(
        "another periodic save in flight", lambda: saving(path, doc["results"][0]["step"]), proc, timeout=90
    )
    stopped = ferry(home, "checkpoint", "c", "--stop", "--wait", "--timeout", "60")
    assert stopped.exit_code == 0, stopped.output
    assert "checkpointed and stopping at step" in stopped.stdout
    proc.communicate(timeout=60)
    assert proc.returncode == EXIT_CHECKPOINTED

    again = start(home, "c", ck, command)
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert_same(reference, out)
