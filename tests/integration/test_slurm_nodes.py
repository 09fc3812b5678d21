"""SLURM on two nodes, for real: two slurmd on this machine (slurm_cluster.py, nodes=2), the
generated many-node sbatch script (`srun ferry run -- torchrun --nnodes $SLURM_NNODES ...`, no
ferry option), one FERRY_HOME for both nodes (a shared home folder). SLURM signals every task
of the step as `--signal=USR1@T` does: both nodes checkpoint the same step, task 0 alone
requeues the job, which runs again, resumes on both nodes and completes, bitwise equal to the
plain run."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, require_slurm, slurm_cluster

from ferry.runtime.jobdir import JobDir
from ferry.schedulers.slurm import SbatchSpec, claim_name, sbatch_script

from manynodes import EPOCHS, SCRIPT, assert_same, free_port, plain_reference
from trainrun import env_for

pytestmark = pytest.mark.integration
FERRY = [sys.executable, "-c", "from ferry.cli import main; main()"]


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[SlurmCluster]:
    require_slurm()
    with slurm_cluster(nodes=2) as cluster:
        yield cluster


def until(what: str, ready: object, timeout: float, log: Path) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = ready() if callable(ready) else None
        if value:
            return value
        if time.monotonic() > deadline:
            tail = log.read_text()[-4000:] if log.exists() else ""
            raise AssertionError(f"timed out waiting for {what}\n{tail}")
        time.sleep(0.1)


def test_srun_on_two_nodes_checkpoints_requeues_once_and_resumes_bitwise(
    two_nodes: SlurmCluster, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    reference = plain_reference(tmp_path_factory)
    home, out, log = tmp_path / "home", tmp_path / "run", tmp_path / "job.out"
    spec = SbatchSpec(
        command=[SCRIPT, "--out", str(out), "--epochs", str(EPOCHS), "--sleep", "0.1"],
        job_name="ferry-nodes",
        grace_seconds=60,
        output=str(log),
        ferry=FERRY,
        nodes=2,
        rendezvous=f"127.0.0.1:{free_port()}",
    )
    script = tmp_path / "nodes.sbatch"
    script.write_text(sbatch_script(spec))
    bin_dir = str(Path(sys.executable).parent)
    env = {**env_for(home, OMP_NUM_THREADS="1"), **two_nodes.env, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    job_id = two_nodes.run("sbatch", "--parsable", str(script), env=env, cwd=tmp_path).strip().split(";")[0]
    nodes = [JobDir(str(home / "jobs" / f"slurm-{job_id}@node{n}")) for n in (0, 1)]
    until("both nodes to train 5 steps", lambda: all(j.status().get("step", 0) >= 5 for j in nodes), 240, log)
    two_nodes.run("scancel", "--signal=USR1", job_id)  # every task of the step, as --signal=USR1@T

    def requeued() -> bool:
        j = two_nodes.job(job_id)
        return j.get("Restarts") == "1" and j["JobState"] in ("PENDING", "RUNNING")

    until("the requeue", requeued, 120, log)

    def ended() -> dict[str, str] | None:
        j = two_nodes.job(job_id)
        return j if j["JobState"] in ("COMPLETED", "FAILED", "CANCELLED") else None

    final = until("the job to complete", ended, 300, log)
    text = log.read_text()
    assert isinstance(final, dict) and final["JobState"] == "COMPLETED" and final["Restarts"] == "1", (
        final,
        text[-4000:],
    )
    assert text.count(f"requeued SLURM job {job_id}") == 1, text[-4000:]
    assert text.count("ferry: resumed from") == 2 and "Traceback" not in text, text[-4000:]
    assert sorted(p.name for p in Path(nodes[0].path).glob("slurm-requeue-*.json")) == [claim_name(job_id, 0)]
    assert not list(Path(nodes[1].path).glob("slurm-requeue-*.json"))
    assert {j.status().get("state") for j in nodes} == {"finished"}
    assert_same(reference, out)
