"""SLURM for real: a single-node cluster (slurm_cluster.py) runs a ferry job that is
signalled the way ``--signal=B:USR1@T`` does it, checkpoints, requeues itself, resumes and
finishes bitwise equal to an uninterrupted run; two SLURM jobs in a row with one ``--job-id``
are both requeued, and ferry asks for each requeue only after the checkpoint is committed
and the job's end recorded. Plus the requeue guards against a fake-free ``scontrol``
stand-in (a real executable that records its calls) and a missing one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import SlurmCluster, require_slurm, slurm, slurm_cluster

from ferry.schedulers.slurm import SbatchSpec, claim_name, sbatch_script

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


def preempt_and_finish(
    cluster: SlurmCluster, tmp_path: Path, spec: SbatchSpec, env: dict[str, str], job: Path | None = None
) -> tuple[str, dict[str, str], str]:
    """Submit ``spec``; once its worker trained 5 steps, signal it as ``--signal=B:USR1@T``
    does; wait for the requeue (one restart) and for the job's end. ``job``: its ferry job
    directory, ``slurm-<id>`` under FERRY_HOME when None. Returns the SLURM job id, its final
    ``scontrol show job`` fields and its output."""
    script = tmp_path / f"{spec.job_name}.sbatch"
    script.write_text(sbatch_script(spec))
    log = Path(spec.output)
    submitted_at = time.time()
    submitted = cluster.run("sbatch", "--parsable", str(script), env=env, cwd=tmp_path)
    job_id = submitted.strip().split(";")[0]
    job = job or Path(env["FERRY_HOME"]) / "jobs" / f"slurm-{job_id}"

    def trained() -> bool:  # by this SLURM job: a job directory may hold an earlier job's status
        s = status(job)
        return s.get("started", 0) >= submitted_at and s.get("state") == "running" and s.get("step", 0) >= 5

    until("training to reach step 5", trained, 60, log)
    cluster.run("scancel", "--signal=USR1", "--batch", job_id)

    # Requeued: back to PENDING, with a BeginTime ahead.
    def requeued() -> bool:
        j = cluster.job(job_id)
        return j.get("Restarts") == "1" and j["JobState"] == "PENDING"

    until("the requeue", requeued, 60, log)
    # It runs again once its BeginTime comes, CRED_EXPIRE + 1 s after the requeue: the path a
    # user gets, without an operator's StartTime=now.

    def ended() -> dict[str, str] | None:
        j = cluster.job(job_id)
        return j if j["JobState"] in ("COMPLETED", "FAILED", "CANCELLED") else None

    final = until("the job to complete", ended, 90, log)
    return job_id, final, log.read_text()


def assert_requeued_and_resumed(job_id: str, final: dict[str, str], text: str) -> None:
    assert final["JobState"] == "COMPLETED" and final["ExitCode"] == "0:0", (final, text[-4000:])
    assert final["Restarts"] == "1", (final, text[-4000:])
    assert f"requeued SLURM job {job_id}" in text, text[-4000:]
    assert "ferry: resumed from" in text, text[-4000:]


def test_usr1_checkpoints_requeues_and_resumes_bitwise(
    slurm: SlurmCluster, tmp_path: Path, reference: Path
) -> None:
    home, out = tmp_path / "home", tmp_path / "run"
    spec = SbatchSpec(
        command=train(out),
        job_name="ferry-slurm-test",
        grace_seconds=30,
        output=str(tmp_path / "job.out"),
        ferry=FERRY,
        ferry_options=["--no-autotrack", "--dir", str(tmp_path / "ck")],
    )
    job_id, final, text = preempt_and_finish(slurm, tmp_path, spec, {**env_for(home), **slurm.env})
    assert_requeued_and_resumed(job_id, final, text)
    job = home / "jobs" / f"slurm-{job_id}"
    assert sorted(p.name for p in job.glob("slurm-requeue-*.json")) == [claim_name(job_id, 0)]
    assert_same(reference, out)


def recording_scontrol(folder: Path, job: Path) -> Path:
    """An ``scontrol`` that, before it runs the real one, copies what ferry had written when it
    asked for the requeue: the job's status and events (``job``) and the environment, into
    ``folder/asked-<n>``; for the order of events."""
    folder.mkdir(exist_ok=True)
    exe = folder / "scontrol"
    real = shutil.which("scontrol")
    assert real is not None
    exe.write_text(
        "#!/bin/sh\n"
        f'n=$(ls -d "{folder}"/asked-* 2>/dev/null | wc -l); seen="{folder}/asked-$n"; mkdir "$seen"\n'
        f'cp "{job}/status.json" "{job}/events.jsonl" "$seen/"; env > "$seen/env.txt"\n'
        f'exec "{real}" "$@"\n'
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def assert_recorded_before_the_requeue(asked: Path, text: str) -> None:
    """When ferry asked SLURM for the requeue, the checkpoint was committed and the job's end
    recorded; ferry's last line came before SLURM cancelled the batch step."""
    st = json.loads((asked / "status.json").read_text())
    events = [json.loads(line) for line in (asked / "events.jsonl").read_text().splitlines()]
    assert st["state"] == "checkpointed" and st["exit_code"] == 85, st
    assert st["last_checkpoint"]["step"] == st["step"] and Path(st["url"]).is_dir(), st
    assert [e["event"] for e in events][-3:] == ["stop", "worker_exit", "run_end"], events[-3:]
    assert events[-1]["state"] == "checkpointed" and events[-1]["exit_code"] == 85, events[-1]
    end = text.index("; exit 85")
    assert end < text.index("requeued SLURM job"), text[-4000:]
    cancelled = text.find("DUE TO JOB REQUEUE")
    assert cancelled == -1 or end < cancelled, text[-4000:]


def test_two_slurm_jobs_with_one_job_id_are_both_requeued_and_resume(tmp_path: Path, reference: Path) -> None:
    """``--job-id`` reused by a second SLURM job (what ferry's own messages advise), on a
    fresh cluster each, whose job ids start again at 1: the first job's requeue claim, of
    the same SLURM job id, must not stop the second's requeue. Both jobs preempted, both
    requeued once, both resumed, both bitwise equal to the uninterrupted run. (Claims of
    different SLURM job ids have different names: tests/unit/test_schedulers.py.)"""
    require_slurm()
    home = tmp_path / "home"
    job = home / "jobs" / "shared"
    exe = recording_scontrol(tmp_path / "bin", job)
    ids = []
    for n in (1, 2):
        out, ck = tmp_path / f"run{n}", tmp_path / f"ck{n}"
        spec = SbatchSpec(
            command=train(out),
            job_name=f"ferry-slurm-{n}",
            grace_seconds=30,
            output=str(tmp_path / f"job{n}.out"),
            ferry=FERRY,
            ferry_options=["--no-autotrack", "--job-id", "shared", "--dir", str(ck)],
        )
        with slurm_cluster() as cluster:
            env = {**env_for(home, FERRY_SLURM_SCONTROL=str(exe)), **cluster.env}
            job_id, final, text = preempt_and_finish(cluster, tmp_path, spec, env, job)
        assert_requeued_and_resumed(job_id, final, text)
        assert_same(reference, out)
        assert_recorded_before_the_requeue(tmp_path / "bin" / f"asked-{n - 1}", text)
        ids.append(job_id)
    assert ids == ["1", "1"]  # the very case of a claim from another SLURM job with the same id
    assert not (tmp_path / "bin" / "asked-2").exists()  # one requeue each
    assert sorted(p.name for p in job.glob("slurm-requeue-*.json")) == sorted({claim_name(i, 0) for i in ids})


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
    ledger = json.loads((job / claim_name("77_3", 0)).read_text())
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
