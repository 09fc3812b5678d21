"""SLURM for real: a single-node cluster (slurm_cluster.py) runs a ferry job that is
signalled the way ``--signal=B:USR1@T`` does it, checkpoints, requeues itself, resumes and
finishes bitwise equal to an uninterrupted run. Plus the requeue guards against a fake-free
``scontrol`` stand-in (a real executable that records its calls) and a missing one."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import SlurmCluster, slurm

from ferry.schedulers.slurm import SbatchSpec, sbatch_script

from trainrun import SCRIPTS, assert_same, env_for
from trainrun import job_status as status

__all__ = ["slurm"]

pytestmark = pytest.mark.integration
FERRY = [sys.executable, "-c", "from ferry.cli import main; main()"]


def until(what: str, predicate: Callable[[], Any], timeout: float, log: Path | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = log.read_text()[-4000:] if log is not None and log.exists() else ""
            raise AssertionError(f"timed out waiting for {what}\n{tail}")
        time.sleep(0.1)


def test_usr1_checkpoints_requeues_and_resumes_bitwise(
    slurm: SlurmCluster, tmp_path: Path, reference: Path
) -> None:
    home, out, log = tmp_path / "home", tmp_path / "run", tmp_path / "job.out"
    spec = SbatchSpec(
        command=[sys.executable, str(SCRIPTS / "train_explicit.py"), "--out", str(out), "--sleep", "0.05"],
        job_name="ferry-slurm-test",
        grace_seconds=30,
        output=str(log),
        ferry=FERRY,
        ferry_options=["--no-autotrack", "--dir", str(tmp_path / "ck")],
    )
    script = tmp_path / "train.sbatch"
    script.write_text(sbatch_script(spec))
    env = {**env_for(home), **slurm.env}
    submitted = subprocess.run(
        ["sbatch", "--parsable", str(script)], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    job = home / "jobs" / f"slurm-{job_id}"

    until("training to reach step 5", lambda: status(job).get("step", 0) >= 5, 60, log)
    slurm.run("scancel", "--signal=USR1", "--batch", job_id)

    # Requeued: back to PENDING, with a BeginTime ahead.
    def requeued() -> bool:
        j = slurm.job(job_id)
        return j.get("Restarts") == "1" and j["JobState"] == "PENDING"

    until("the requeue", requeued, 60, log)
    # It runs again once its BeginTime comes, CRED_EXPIRE s after the requeue (slurm_cluster.py
    # says why the test does not force it with StartTime=now).

    def ended() -> dict[str, str] | None:
        j = slurm.job(job_id)
        return j if j["JobState"] in ("COMPLETED", "FAILED", "CANCELLED") else None

    final = until("the job to complete", ended, 90, log)
    text = log.read_text()
    assert final["JobState"] == "COMPLETED" and final["ExitCode"] == "0:0", (final, text[-4000:])
    assert final["Restarts"] == "1"
    assert f"requeued SLURM job {job_id}" in text, text[-4000:]
    assert "ferry: resumed from" in text, text[-4000:]
    assert sorted(p.name for p in job.glob("slurm-requeue-*")) == ["slurm-requeue-0.json"]
    assert_same(reference, out)


# ------------------------------------------------------------------ without a cluster


def fake_scontrol(folder: Path, exit_code: int = 0) -> Path:
    """A real ``scontrol`` stand-in that appends its arguments to ``calls.txt``."""
    folder.mkdir(exist_ok=True)
    exe = folder / "scontrol"
    exe.write_text(f'#!/bin/sh\necho "$@" >> "{folder}/calls.txt"\nexit {exit_code}\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return folder / "calls.txt"


def train(out: Path) -> list[str]:
    return [sys.executable, str(SCRIPTS / "train_explicit.py"), "--out", str(out), "--sleep", "0.05"]


def stop_under_slurm(tmp_path: Path, path: str, **slurm_env: str) -> subprocess.CompletedProcess[str]:
    """``ferry run`` as a SLURM batch shell would run it, stopped by SIGUSR1 at step 5."""
    env = env_for(tmp_path / "home", PATH=path, SLURM_JOB_ID="4242", **slurm_env)
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [*FERRY, "run", "--no-autotrack", "--dir", str(tmp_path / "ck"), "--", *train(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    job = tmp_path / "home" / "jobs" / f"slurm-{slurm_env.get('SLURM_ARRAY_JOB_ID', '4242')}"
    if "SLURM_ARRAY_TASK_ID" in slurm_env:
        job = job.with_name(f"{job.name}_{slurm_env['SLURM_ARRAY_TASK_ID']}")
    try:
        until("step 5", lambda: status(job).get("step", 0) >= 5 or proc.poll() is not None, 60)
        proc.send_signal(signal.SIGUSR1)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_missing_scontrol_is_a_clear_error_and_the_checkpoint_lands(tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    done = stop_under_slurm(tmp_path, str(bare), FERRY_SLURM_SCONTROL="scontrol-not-here")
    assert done.returncode == 85, done.stderr
    assert "cannot requeue SLURM job 4242: 'scontrol-not-here' is not on PATH" in done.stderr
    assert "resubmit the job" in done.stderr
    assert [p for p in (tmp_path / "ck").iterdir() if p.name.startswith("step")], "no checkpoint"


def test_requeue_is_array_aware_once_per_preemption_and_guarded(tmp_path: Path) -> None:
    calls = fake_scontrol(tmp_path / "bin")
    path = f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"
    array = {"SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "3"}
    first = stop_under_slurm(tmp_path, path, **array)
    assert first.returncode == 85, first.stderr
    assert calls.read_text().splitlines() == ["requeue 77_3"]
    job = tmp_path / "home" / "jobs" / "slurm-77_3"
    ledger = json.loads((job / "slurm-requeue-0.json").read_text())
    assert ledger["job"] == "77_3" and ledger["restart"] == 0 and ledger["step"] >= 5

    # The same preemption seen again (another layer, a second signal): no second requeue.
    from ferry.schedulers.slurm import detect

    adapter = detect({"SLURM_JOB_ID": "4242", "PATH": path, **array})
    assert adapter is not None
    assert adapter.after_checkpoint(step=ledger["step"] + 3, code=85, state_dir=str(job)) == 85
    assert calls.read_text().splitlines() == ["requeue 77_3"]
    # Restarted, but stopped again at the very step of the last requeue: no requeue loop.
    again = detect({"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1", "PATH": path, **array})
    assert again is not None
    again.after_checkpoint(step=ledger["step"], code=85, state_dir=str(job))
    assert calls.read_text().splitlines() == ["requeue 77_3"]
    # Progress made: requeued once more; then the retry budget stops it.
    again.after_checkpoint(step=ledger["step"] + 1, code=85, state_dir=str(job))
    assert calls.read_text().splitlines() == ["requeue 77_3", "requeue 77_3"]
    spent = detect(
        {"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "2", "FERRY_SLURM_MAX_REQUEUES": "2", "PATH": path}
    )
    assert spent is not None
    spent.after_checkpoint(step=ledger["step"] + 9, code=85, state_dir=str(job))
    assert len(calls.read_text().splitlines()) == 2
