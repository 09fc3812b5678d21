"""HTCondor without daemons (none exist for this machine): real job ad files, as the
starter writes them to ``_CONDOR_JOB_AD``, and real processes evicted with SIGTERM.

An eviction is replayed the way HTCondor does it: SIGTERM (KillSig) to the job in its
scratch folder; the job exits with the ad's checkpoint code; the checkpoint folder named
by TransferCheckpoint is carried to a fresh scratch folder (another slot); the job starts
again there and resumes."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trainrun import SCRIPTS, assert_same, env_for
from trainrun import job_status as status

pytestmark = pytest.mark.integration
FERRY_RUN = [sys.executable, "-c", "from ferry.cli import main; main()", "run", "--no-autotrack"]
TRAIN = [sys.executable, str(SCRIPTS / "train_explicit.py")]


def job_ad(path: Path, **attrs: Any) -> Path:
    """A job ad file in ``condor_q -l`` format."""
    base: dict[str, Any] = {
        "ClusterId": 4711,
        "ProcId": 2,
        "Owner": '"ferry"',
        "TransferCheckpoint": '"ferry-checkpoints"',
        "WantFTOnCheckpoint": "true",
        "JobMaxVacateTime": 60,
        "NumJobStarts": 1,
        "Requirements": '(TARGET.Arch == "X86_64") && (TARGET.OpSys == "LINUX")',
    }
    base.update(attrs)
    path.write_text("".join(f"{k} = {v}\n" for k, v in base.items() if v is not None))
    return path


def evict(
    argv: list[str], scratch: Path, env: dict[str, str], job: Path, before: Any = None
) -> subprocess.CompletedProcess[str]:
    """Start ``argv`` in ``scratch``; at step 5, SIGTERM it as HTCondor evicts a job."""
    proc = subprocess.Popen(
        argv,
        cwd=scratch,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while status(job).get("step", 0) < 5 and proc.poll() is None:
            assert time.monotonic() < deadline, "the job never reached step 5"
            time.sleep(0.05)
        if before is not None:
            before()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def test_eviction_exits_with_the_ads_code_and_resumes_on_another_slot(
    tmp_path: Path, reference: Path
) -> None:
    home, out = tmp_path / "home", tmp_path / "run"
    slot1, slot2 = tmp_path / "slot1", tmp_path / "slot2"
    slot1.mkdir()
    ad = job_ad(tmp_path / ".job.ad", CheckpointExitCode=77, SuccessCheckpointExitCode=None)
    env = env_for(home, _CONDOR_JOB_AD=str(ad))
    argv = [*FERRY_RUN, "--", *TRAIN, "--out", str(out), "--sleep", "0.05"]
    job = home / "jobs" / "condor-4711.2"
    done = evict(argv, slot1, env, job)
    assert done.returncode == 77, done.stderr
    assert status(job)["state"] == "checkpointed"
    assert json.loads((job / "job.json").read_text())["scheduler"] == "htcondor"
    # HTCondor carries transfer_checkpoint_files to the next slot's scratch folder.
    shutil.copytree(slot1 / "ferry-checkpoints", slot2 / "ferry-checkpoints")
    shutil.rmtree(slot1)
    again = subprocess.run(
        argv[:-2],
        cwd=slot2,
        env=env_for(home, _CONDOR_JOB_AD=str(job_ad(ad, CheckpointExitCode=77, NumJobStarts=2))),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert "ferry: resumed from" in again.stderr
    assert_same(reference, out)


def test_the_worker_alone_reads_success_checkpoint_exit_code(tmp_path: Path) -> None:
    """No ``ferry run``: the training process itself takes its exit code from the ad, and
    SuccessCheckpointExitCode wins over the older CheckpointExitCode."""
    ad = job_ad(tmp_path / ".job.ad", CheckpointExitCode=77, SuccessCheckpointExitCode=93)
    env = env_for(tmp_path / "home", _CONDOR_JOB_AD=str(ad), FERRY_DIR=str(tmp_path / "ck"), FERRY_JOB_ID="w")
    done = evict(
        [*TRAIN, "--out", str(tmp_path / "run"), "--sleep", "0.05"],
        tmp_path,
        env,
        tmp_path / "home" / "jobs" / "w",
    )
    assert done.returncode == 93, done.stderr
    assert any(p.name.startswith("step") for p in (tmp_path / "ck").iterdir())


def test_no_checkpoint_code_when_nothing_was_saved(tmp_path: Path) -> None:
    """The stop's save fails (the checkpoint folder turned into a file): the job exits 86,
    never the checkpoint code, which would have HTCondor restart it from nothing new."""
    home, scratch = tmp_path / "home", tmp_path / "scratch"
    scratch.mkdir()
    ad = job_ad(tmp_path / ".job.ad", CheckpointExitCode=85)
    ck = scratch / "ferry-checkpoints" / "condor-4711.2"

    def break_storage() -> None:
        shutil.rmtree(ck, ignore_errors=True)  # no periodic checkpoint yet: maybe not there
        ck.parent.mkdir(parents=True, exist_ok=True)
        ck.write_text("not a folder")

    argv = [*FERRY_RUN, "--", *TRAIN, "--out", str(tmp_path / "run"), "--sleep", "0.05"]
    done = evict(
        argv, scratch, env_for(home, _CONDOR_JOB_AD=str(ad)), home / "jobs" / "condor-4711.2", break_storage
    )
    assert done.returncode == 86, done.stderr
    assert "could not commit a checkpoint" in done.stderr


def test_a_zero_checkpoint_code_is_refused(tmp_path: Path) -> None:
    ad = job_ad(tmp_path / ".job.ad", CheckpointExitCode=0)
    done = subprocess.run(
        [*FERRY_RUN, "--", *TRAIN, "--out", str(tmp_path / "run")],
        cwd=tmp_path,
        env=env_for(tmp_path / "home", _CONDOR_JOB_AD=str(ad)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "CheckpointExitCode is 0, HTCondor's success code" in done.stderr
    assert "checkpoint_exit_code = 85" in done.stderr
