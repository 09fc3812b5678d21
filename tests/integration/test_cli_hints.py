"""Issue: on real training jobs, ``ferry run --json`` streams the job's events, ``ferry stop``
stops a job with a committed checkpoint, a bundle carries none of the old job's own
variables, and a job started by ``ferry resume BUNDLE`` says, when stopped, the command
that really resumes it: run as printed, it goes on from the step it stopped at, not from
the bundle's."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from ferry.runtime.jobdir import JobDir

from test_cli_jobs import EXIT_CHECKPOINTED, FERRY, ferry, training, wait_for
from trainrun import env_for, train_command

pytestmark = pytest.mark.integration


def test_run_json_events_stop_bundle_and_the_resume_hint(tmp_path: Path) -> None:
    home, out = tmp_path / "home", tmp_path / "run"
    path = home / "jobs" / "j"
    command = train_command(out, "--sleep", "0.1")
    proc = subprocess.Popen(
        [*FERRY, "run", "--json", "--no-autotrack", "--job-id", "j", "--dir", str(tmp_path / "ck"),
         "--every-steps", "4", "--", *command],
        env=env_for(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    wait_for("training to reach step 6", training(path, 6), proc)
    dest = tmp_path / "bundle"
    exported = ferry(home, "export", "j", str(dest), "--timeout", "60")
    assert exported.exit_code == 0, exported.output
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_CHECKPOINTED, stderr
    events = [json.loads(line) for line in stdout.splitlines()]  # every stdout line is an event
    kinds = [e["event"] for e in events]
    assert kinds[:2] == ["run_start", "worker_start"] and kinds[-1] == "run_end", kinds
    assert "checkpoint" in kinds and "stop" in kinds and "worker_exit" in kinds
    assert events[-1]["exit_code"] == EXIT_CHECKPOINTED
    bundle = json.loads((dest / "bundle.json").read_text())
    assert not {"FERRY_HANDOFF_DIR", "FERRY_SUPERVISOR_PID"} & set(bundle["env"]), bundle["env"]

    # resume the bundle as a new job, stop it with `ferry stop`, and follow the printed hint
    resumed = subprocess.Popen(
        [*FERRY, "resume", str(dest), "--job-id", "r1", "--dir", str(tmp_path / "ck-r1")],
        env=env_for(home), stderr=subprocess.PIPE, text=True, cwd=tmp_path, start_new_session=True,
    )  # fmt: skip
    wait_for("the resumed job to train on", training(home / "jobs" / "r1", bundle["step"] + 3), resumed)
    stopped = ferry(home, "stop", "r1", "--timeout", "60", "--json")
    assert stopped.exit_code == 0, stopped.output
    (result,) = json.loads(stopped.stdout)["results"]
    assert result["step"] > bundle["step"]
    _, log = resumed.communicate(timeout=60)
    assert resumed.returncode == EXIT_CHECKPOINTED, log
    assert "run the same command again" not in log
    hint = log.split("to resume, run: ", 1)[1].split("; exit", 1)[0]
    assert "--dir" in hint and str(tmp_path / "ck-r1") in hint and "ferry resume" not in hint, hint

    # run the hint (ferry -> this interpreter's ferry): it resumes at the step `ferry stop` saved
    line = hint.replace("ferry run ", f"{shlex.join(FERRY)} run ", 1)
    again = subprocess.run(
        ["bash", "-c", line], env=env_for(home), capture_output=True, text=True, timeout=180
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    resumes = [e for e in JobDir(str(home / "jobs" / "r1")).events() if e["event"] == "resume"]
    assert resumes[-1]["step"] == result["step"], resumes
