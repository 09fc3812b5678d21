"""Scheduler adapters as data: detection, job identity, exit codes, grace; and the example
files under examples/ checked against the pure functions that generate them."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from ferry.config import Config
from ferry.engine.transfer import TransferPolicy
from ferry.errors import ConfigError
from ferry.schedulers import REGISTRY, SchedulerAdapter, detect
from ferry.schedulers import kubernetes as k8s
from ferry.schedulers.htcondor import parse_job_ad, submit_file
from ferry.schedulers.slurm import (
    Decision,
    SbatchSpec,
    SlurmRun,
    claim_name,
    process_start,
    requeue_decision,
    sbatch_script,
)
from ferry.schedulers.slurm import detect as detect_slurm
from ferry.schedulers.templates import EXAMPLES

EXAMPLES_DIR = Path(__file__).parents[2] / "examples"


def ad_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / ".job.ad"
    path.write_text(text)
    return str(path)


def test_detection_is_a_registry_in_priority_order(tmp_path: Path) -> None:
    ad = ad_file(tmp_path, "ClusterId = 1\nProcId = 0\n")
    assert detect({}).name == "local"
    assert detect({"SLURM_JOB_ID": "9"}).name == "slurm"
    assert detect({"_CONDOR_JOB_AD": ad}).name == "htcondor"
    assert detect({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}).name == "kubernetes"
    assert detect({"SLURM_JOB_ID": "9", "KUBERNETES_SERVICE_HOST": "x"}).name == "slurm"
    assert list(REGISTRY)[-1] == "local"
    for env in ({}, {"SLURM_JOB_ID": "9"}, {"_CONDOR_JOB_AD": ad}, {"KUBERNETES_SERVICE_HOST": "x"}):
        assert isinstance(detect(env), SchedulerAdapter)


def test_forcing_a_scheduler(tmp_path: Path) -> None:
    assert detect({"FERRY_SCHEDULER": "kubernetes"}).name == "kubernetes"
    with pytest.raises(ConfigError, match="use one of slurm, htcondor"):
        detect({"FERRY_SCHEDULER": "pbs"})
    with pytest.raises(ConfigError, match="not a slurm job"):
        detect({"FERRY_SCHEDULER": "slurm"})


def test_slurm_identity_is_array_aware_and_counts_restarts() -> None:
    plain = detect({"SLURM_JOB_ID": "123", "SLURM_RESTART_COUNT": "2"})
    assert plain.job_id() == "slurm-123" and plain.restart_count() == 2
    task = detect({"SLURM_JOB_ID": "130", "SLURM_ARRAY_JOB_ID": "128", "SLURM_ARRAY_TASK_ID": "2"})
    assert task.job_id() == "slurm-128_2" and task.restart_count() == 0
    assert plain.stop_signal == "SIGUSR1" and plain.exit_code(85) == 85


RUN = SlurmRun(job="100", cluster="c", restart=0, started=1000.0)
TASK = SlurmRun(job="128_2", cluster="c", restart=0, started=1000.0)
AGAIN = SlurmRun(job="100", cluster="c", restart=1, started=2000.0)


def claim(
    job: str = "100", cluster: str | None = "c", restart: int = 0, step: int = 5, at: float = 1010.0
) -> dict[str, Any]:
    """A requeue claim as a SLURM job writes it: RUN's own by default, after RUN started."""
    return {"job": job, "cluster": cluster, "restart": restart, "step": step, "time": at}


@pytest.mark.parametrize(
    ("run", "step", "this", "previous", "expected"),
    [
        (RUN, 5, None, None, Decision.REQUEUE),
        (RUN, 5, claim(), None, Decision.ALREADY_REQUEUED),  # a second signal, another layer
        (RUN, 5, claim(job="99"), None, Decision.REQUEUE),  # an earlier SLURM job, same --job-id
        (RUN, 5, claim(cluster="other"), None, Decision.REQUEUE),  # another cluster's job 100
        (RUN, 5, claim(cluster=None), None, Decision.REQUEUE),
        (RUN, 5, claim(restart=1), None, Decision.REQUEUE),
        (RUN, 5, claim(at=900.0), None, Decision.REQUEUE),  # job 100 again, after a state reset
        (RUN, 5, claim(at=999.0), None, Decision.ALREADY_REQUEUED),  # within the clock's slack
        (
            SlurmRun(job="100", cluster="c", restart=0, started=None),
            5,
            claim(at=9.0),
            None,
            Decision.ALREADY_REQUEUED,
        ),
        (TASK, 5, claim(job="128_2"), None, Decision.ALREADY_REQUEUED),
        (TASK, 5, claim(job="128_3"), None, Decision.REQUEUE),  # another task of the array
        (TASK, 5, claim(job="128"), None, Decision.REQUEUE),  # the array as a whole
        (TASK, 5, claim(job="130"), None, Decision.REQUEUE),  # the task's own SLURM_JOB_ID
        (AGAIN, 5, None, claim(), Decision.NO_PROGRESS),
        (AGAIN, 6, None, claim(), Decision.REQUEUE),
        (AGAIN, 5, None, claim(job="99"), Decision.REQUEUE),  # another job's requeue says nothing
        (AGAIN, 5, None, claim(cluster="other"), Decision.REQUEUE),
        (AGAIN, 5, None, claim(restart=1), Decision.REQUEUE),
        (AGAIN, 7, claim(restart=1, step=7, at=2100.0), claim(), Decision.ALREADY_REQUEUED),
        (SlurmRun(job="100", cluster="c", restart=20, started=0.0), 5, None, None, Decision.BUDGET_SPENT),
    ],
)
def test_requeue_decision_keys_the_claim_to_the_slurm_job_and_restart(
    run: SlurmRun, step: int, this: dict[str, Any] | None, previous: dict[str, Any] | None, expected: Decision
) -> None:
    assert requeue_decision(run, step=step, max_requeues=20, claim=this, previous=previous) is expected


def test_claim_files_are_named_per_slurm_job_and_restart() -> None:
    names = {claim_name(job, restart) for job in ("100", "99", "128_2", "128_3") for restart in (0, 1)}
    assert len(names) == 8 and claim_name("128_2", 0) == "slurm-requeue-128_2-0.json"
    assert claim_name("../x y", 3) == "slurm-requeue-..-x-y-3.json"
    assert "/" not in claim_name("a/b", 0)


def test_the_slurm_run_comes_from_the_environment() -> None:
    adapter = detect_slurm(
        {
            "SLURM_JOB_ID": "130",
            "SLURM_ARRAY_JOB_ID": "128",
            "SLURM_ARRAY_TASK_ID": "2",
            "SLURM_RESTART_COUNT": "3",
            "SLURM_CLUSTER_NAME": "c",
        }
    )
    assert adapter is not None
    run = adapter.run()
    assert (run.job, run.cluster, run.restart) == ("128_2", "c", 3)
    started = process_start(os.getpid())
    assert started is not None and started <= time.time() and run.started == started
    assert process_start(2**22 + 1) is None  # above pid_max: no such process


def test_a_claim_from_another_slurm_job_never_blocks_the_requeue(tmp_path: Path) -> None:
    """The stale claims an earlier SLURM job with the same ferry job id left behind, in the
    old layout and the new: the requeue happens, once."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "scontrol"
    exe.write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path}/calls.txt"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    job = tmp_path / "job"
    job.mkdir()
    (job / "slurm-requeue-0.json").write_text('{"job": "1", "restart": 0, "step": 5, "time": 1}')
    (job / claim_name("1", 0)).write_text('{"job": "1", "cluster": "c", "restart": 0, "step": 5, "time": 1}')
    env = {"SLURM_JOB_ID": "2", "SLURM_CLUSTER_NAME": "c", "PATH": str(bin_dir)}
    first = detect_slurm(env)
    assert first is not None and first.after_checkpoint(step=5, code=85, state_dir=str(job)) == 85
    assert (tmp_path / "calls.txt").read_text().splitlines() == ["requeue 2"]
    # SLURM job 1 again (ids start again at 1 after a state reset): its old claim predates it.
    again = detect_slurm({**env, "SLURM_JOB_ID": "1"})
    assert again is not None and again.after_checkpoint(step=5, code=85, state_dir=str(job)) == 85
    assert (tmp_path / "calls.txt").read_text().splitlines() == ["requeue 2", "requeue 1"]
    # The same preemption seen again: no second requeue.
    assert again.after_checkpoint(step=6, code=85, state_dir=str(job)) == 85
    assert (tmp_path / "calls.txt").read_text().splitlines() == ["requeue 2", "requeue 1"]


def test_sbatch_script_is_pure_and_quotes_what_it_must() -> None:
    spec = SbatchSpec(command=["python", "train.py", "--name", "a b; $x"], grace_seconds=60)
    script = sbatch_script(spec)
    assert script == sbatch_script(spec)
    assert "#SBATCH --signal=B:USR1@60" in script and "#SBATCH --requeue" in script
    assert script.splitlines()[-1] == "exec ferry run --grace 50 -- python train.py --name 'a b; $x'"
    with pytest.raises(ValueError, match="grace_seconds must be > 10"):
        SbatchSpec(command=["x"], grace_seconds=5)


def test_job_ad_parsing_and_checkpoint_exit_code(tmp_path: Path) -> None:
    ad = parse_job_ad('ClusterId = 7\nOwner = "me"\nWantFTOnCheckpoint = true\nRate = 0.5\nReq = (a && b)\n')
    assert ad == {"ClusterId": 7, "Owner": "me", "WantFTOnCheckpoint": True, "Rate": 0.5, "Req": "(a && b)"}
    both = detect(
        {"_CONDOR_JOB_AD": ad_file(tmp_path, "CheckpointExitCode = 77\nSuccessCheckpointExitCode = 93\n")}
    )
    assert both.exit_code(85) == 93 and both.worker_defaults() == {"exit_code": 93}
    old = detect(
        {"_CONDOR_JOB_AD": ad_file(tmp_path, "ClusterId = 3\nProcId = 1\nCheckpointExitCode = 77\n")}
    )
    assert old.exit_code(85) == 77 and old.job_id() == "condor-3.1"
    none = detect({"_CONDOR_JOB_AD": ad_file(tmp_path, "JobMaxVacateTime = 30\nNumJobStarts = 3\n")})
    assert none.exit_code(85) == 85 and none.worker_defaults() == {"grace_seconds": 30.0}
    assert none.restart_count() == 2
    zero = detect({"_CONDOR_JOB_AD": ad_file(tmp_path, "CheckpointExitCode = 0\n")})
    with pytest.raises(ConfigError, match="success code"):
        zero.exit_code(85)
    with pytest.raises(ConfigError, match="cannot be read"):
        detect({"_CONDOR_JOB_AD": str(tmp_path / "missing.ad")})


def test_the_workers_config_takes_the_ads_code_unless_ferry_exit_code_says_otherwise(tmp_path: Path) -> None:
    ad = ad_file(tmp_path, "CheckpointExitCode = 77\n")
    assert Config.from_env({"_CONDOR_JOB_AD": ad}).exit_code == 77
    assert Config.from_env({"_CONDOR_JOB_AD": ad, "FERRY_EXIT_CODE": "90"}).exit_code == 90
    assert Config.from_env({}).exit_code == 85


def test_submit_file_refuses_codes_that_mean_something_else() -> None:
    assert "checkpoint_exit_code     = 85" in submit_file()
    for code in (0, 86):
        with pytest.raises(ValueError):
            submit_file(checkpoint_exit_code=code)


def test_kubernetes_grace_from_the_measured_save_time() -> None:
    assert k8s.required_grace_seconds(0.0) == 10
    assert k8s.required_grace_seconds(20.0, step_seconds=1.0) == 52
    pod = detect({"KUBERNETES_SERVICE_HOST": "x", k8s.GRACE_ENV: "30"})
    assert pod.worker_defaults() == {"grace_seconds": 30.0}
    assert pod.grace_warning(5.0) is None
    warning = pod.grace_warning(20.0)
    assert warning is not None and "terminationGracePeriodSeconds=30 is too short" in warning
    assert "at least 50" in warning
    assert detect({"KUBERNETES_SERVICE_HOST": "x"}).grace_warning(100.0) is None  # unknown grace
    assert k8s.prestop_command(60) == ["ferry", "checkpoint", "--all", "--wait", "--timeout", "60"]
    with pytest.raises(ValueError, match="no room"):
        k8s.ManifestSpec(grace_seconds=5)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_recorded_examples_match_their_generators(name: str) -> None:
    recorded = (EXAMPLES_DIR / name).read_text()
    assert recorded == EXAMPLES[name](), (
        f"examples/{name} differs from its generator: after a deliberate change, run "
        "`python -m ferry.schedulers.templates examples`"
    )


def test_transfer_policy_checks() -> None:
    with pytest.raises(ConfigError, match="use one of background, sync"):
        TransferPolicy(remote="s3://b/x", mode="later")
    with pytest.raises(ConfigError, match=">= 1"):
        TransferPolicy(remote="s3://b/x", keep_last=0)


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "nan"])
def test_a_bad_requeue_budget_is_a_one_line_error(value: str) -> None:
    from ferry.schedulers import slurm

    with pytest.raises(ConfigError, match=r"FERRY_SLURM_MAX_REQUEUES=.*whole number"):
        slurm.detect({"SLURM_JOB_ID": "7", "FERRY_SLURM_MAX_REQUEUES": value})
    assert slurm.detect({"SLURM_JOB_ID": "7", "FERRY_SLURM_MAX_REQUEUES": "3"}).max_requeues == 3  # type: ignore[union-attr]
