"""Issue 29, the pieces: what a launch says about its nodes (torchrun's options, its PET_*
variables, a SLURM step), the job's name across nodes, the checkpoint root's lock shared by
one job's nodes, the jobs' view of a job's nodes, the stalled-peer bookkeeping, and what the
supervisor and SLURM do with a node's exit."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ferry.errors import JobError
from ferry.ops.jobs import find_job, job_nodes
from ferry.ops.requests import send
from ferry.runtime.identity import rendezvous_job_id
from ferry.runtime.jobdir import JobDir, node_dir_name
from ferry.runtime.launch import Nodes, nodes_of, rank_exit_code, torchrun_options
from ferry.runtime.peerwatch import DONE, Silence, beat_interval, describe
from ferry.runtime.rootlock import LOCK_NAME, RootLock, nodes
from ferry.schedulers.slurm import SlurmAdapter, claim_name
from ferry.supervisor.decide import WorkerExit, decide_exit
from ferry.supervisor.options import RunOptions

T = "/usr/bin/torchrun"
SCRIPT = ["train.py", "--nnodes", "9"]  # the script's own arguments are not torchrun's
SLURM_STEP = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4"}

LAUNCHES = [
    # (command, env, count, rank, rendezvous)
    ([T, "--nnodes", "2", "--node_rank", "1", "--master_addr", "h0", "--master_port", "1234", *SCRIPT], {},
     2, 1, "h0:1234"),
    ([T, "--nnodes=2", "--node-rank=0", "--master-addr=h0", *SCRIPT], {}, 2, 0, "h0:29500"),
    ([T, "--nnodes", "2", *SCRIPT], {}, 2, 0, "127.0.0.1:29500"),
    ([T, "--nnodes", "1:4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h0", "--rdzv-id", "42", *SCRIPT],
     {}, 4, None, "42@h0:29400"),
    ([T, "--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", "h0:7", *SCRIPT],
     SLURM_STEP, 2, 3, "h0:7"),
    (["python3", "-m", "torch.distributed.run", "--nnodes", "3", "--node_rank", "2", *SCRIPT], {}, 3, 2,
     "127.0.0.1:29500"),
    # a PyTorchJob's pod: the training operator's PET_* variables are torchrun's defaults
    ([T, "--master-addr", "job-master-0", "train.py"], {"PET_NNODES": "4", "PET_NODE_RANK": "2"}, 4, 2,
     "job-master-0:29500"),
    ([T, "--standalone", "--nnodes", "2", *SCRIPT], {}, 1, None, None),
    ([T, "--nproc_per_node", "8", *SCRIPT], {}, 1, None, None),
    (["python", "train.py", "--nnodes", "2"], {}, 1, None, None),
    (["python", "train.py"], SLURM_STEP, 4, 3, None),  # srun: one ferry run per task
    # the batch shell itself: no step
    (["python", "train.py"], {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4"}, 1, None, None),
]  # fmt: skip


@pytest.mark.parametrize(("command", "env", "count", "rank", "rendezvous"), LAUNCHES)
def test_a_launch_says_how_many_nodes_which_one_and_what_they_share(
    command: list[str], env: dict[str, str], count: int, rank: int | None, rendezvous: str | None
) -> None:
    assert nodes_of(command, env) == Nodes(count=count, rank=rank, rendezvous=rendezvous)


def test_torchrun_options_stop_at_the_script_and_know_flags() -> None:
    opts = torchrun_options(
        [T, "--standalone", "--nproc-per-node", "2", "-m", "pkg.train", "--node_rank", "5"]
    )
    assert opts == {"standalone": "1", "nproc_per_node": "2", "m": "1"}
    assert torchrun_options(["python", "train.py"]) is None


def test_every_node_names_the_job_alike_from_the_rendezvous() -> None:
    assert rendezvous_job_id("h0:1234") == "torchrun-h0-1234"
    assert rendezvous_job_id("job 7@h0.example:29400") == "torchrun-job-7-h0.example-29400"
    assert Nodes(count=2, rank=1).key() == "node1"
    assert Nodes(count=2).key()  # a host name, as a file name
    assert node_dir_name("j", "node1") == "j@node1"


def test_a_rank_of_torchrun_under_ferry_run_exits_0_after_its_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setenv("FERRY_SUPERVISOR_PID", "1")
    assert rank_exit_code(85) == 85
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    assert rank_exit_code(85) == 0
    monkeypatch.delenv("FERRY_SUPERVISOR_PID")
    assert rank_exit_code(85) == 85  # plain torchrun: the status is no one's to read


# ---------------------------------------------------------------------- the root's lock


def record(host: str = "h") -> dict[str, object]:
    return {"host": host, "supervisor_pid": 123, "job_dir": f"/home/{host}/jobs/j"}


def test_one_jobs_nodes_share_the_root_and_another_job_is_refused(tmp_path: Path) -> None:
    root = str(tmp_path / "ck")
    first = RootLock.share(root, "j", "node0", record("a"), exact=True)
    second = RootLock.share(root, "j", "node1", record("b"), exact=True)
    assert first is not None and second is not None and len(first.fds) == 2
    with pytest.raises(JobError, match="being written by the live job j"):
        RootLock.share(root, "other", "node0", record(), exact=True)
    with pytest.raises(JobError, match="being written by the live job j"):
        RootLock.acquire(root, "other")  # a job on one node, too
    with pytest.raises(JobError, match=r"node1 of job j is already running \(on b, ferry run pid 123\)"):
        RootLock.share(root, "j", "node1", record(), exact=True)
    listed = {n["node"]: (n["host"], n["alive"]) for n in nodes(root)}
    assert listed == {"node0": ("a", True), "node1": ("b", True)}
    first.release()
    assert {n["node"] for n in nodes(root)} == {"node1"}
    second.release()
    assert not list((tmp_path / "ck").iterdir())  # it got nothing: no lock is left behind


def test_nodes_named_by_host_take_the_hosts_next_slot(tmp_path: Path) -> None:
    root = str(tmp_path / "ck")
    held = [RootLock.share(root, "j", "vm", record(), exact=False) for _ in range(3)]
    assert sorted(n["node"] for n in nodes(root)) == ["vm", "vm-2", "vm-3"]
    for lock in held:
        assert lock is not None
        lock.release()


def test_a_one_node_run_of_the_job_keeps_the_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ferry.runtime.rootlock.SHARE_WAIT_SECONDS", 0.2)
    root = str(tmp_path / "ck")
    alone = RootLock.acquire(root, "j")
    assert alone is not None
    with pytest.raises(JobError, match="held by a run of job j on one node"):
        RootLock.share(root, "j", "node0", record(), exact=True)
    (tmp_path / "ck" / "step-000000000001").mkdir()
    alone.release()
    shared = RootLock.share(root, "j", "node0", record(), exact=True)
    assert shared is not None and (tmp_path / "ck" / LOCK_NAME).read_text() == "j"
    shared.release()
    assert (
        RootLock.share("s3://b/ck", "j", "node0", record(), exact=True) is None and nodes("s3://b/ck") == []
    )


def test_any_node_finds_the_job_and_lists_its_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_HOME", str(tmp_path / "home"))
    root = str(tmp_path / "ck")
    locks = []
    for n, host in enumerate(("a", "b")):
        job = JobDir.create("j", name=node_dir_name("j", f"node{n}"))
        job.write_identity(id="j", node=f"node{n}", nodes=2, checkpoint_dir=root, host=host, supervisor_pid=1)
        job.update_status("running", step=3)
        job.acquire_lock()  # as its supervisor holds it
        locks.append(RootLock.share(root, "j", f"node{n}", {**record(host), "job_dir": job.path}, exact=True))
    JobDir.create("other").write_identity(id="other")
    found = find_job("j")
    assert found.id == "j" and found.identity.get("node") in ("node0", "node1")
    shown = job_nodes(found)
    assert [(n["node"], n["host"], n["alive"], n["state"]) for n in shown] == [
        ("node0", "a", True, "running"),
        ("node1", "b", True, "running"),
    ]
    assert job_nodes(find_job("other")) == []
    with pytest.raises(JobError, match="cannot restart job j in place: it runs on 2 nodes"):
        send(found, "restart", {})
    for lock in locks:
        assert lock is not None
        lock.release()


# ---------------------------------------------------------------------- stalled peers


def test_a_rank_silent_longer_than_the_stall_is_named() -> None:
    silence = Silence([1, 2, 3], now=0.0)
    silence.read({1: b"1 h1 0", 2: b"1 h2 1", 3: b"1 h3 1"}, now=1.0)
    assert silence.silent(5.0, now=5.5) is None
    silence.read({1: b"2 h1 0", 2: b"1 h2 1", 3: DONE}, now=5.5)  # 2 did not beat; 3 ended
    assert silence.silent(5.0, now=6.5) == (2, b"1 h2 1")
    assert describe(2, b"1 h2 1") == "rank 2 (node 1, host h2)"
    assert describe(7, None) == "rank 7"


def test_a_watcher_that_did_not_run_blames_no_peer() -> None:
    silence = Silence([1], now=0.0)
    silence.read({1: b"1 h 0"}, now=1.0)
    silence.resume(now=100.0)  # the watcher's own node was stopped for 99 s
    silence.read({1: b"1 h 0"}, now=100.5)
    assert silence.silent(3.0, now=101.0) is None


def test_a_store_that_stops_answering_counts_as_silence() -> None:
    silence = Silence([1], now=0.0)
    silence.read({1: b"1 h 0"}, now=1.0)
    assert silence.silent(3.0, now=3.5) is None
    assert silence.silent(3.0, now=4.5) == (-1, None)
    assert beat_interval(60.0) == 5.0 and beat_interval(2.0) == 0.5


# ---------------------------------------------------------------------- one outcome per node


def test_a_node_whose_ranks_exited_0_after_a_stop_ends_checkpointed() -> None:
    o = RunOptions()
    after_signal = decide_exit(WorkerExit(returncode=0, checkpointed=True, stop_signal="SIGTERM"), o, "/ck")
    assert (after_signal.action, after_signal.code, after_signal.hand_back) == ("checkpointed", 85, True)
    asked = decide_exit(WorkerExit(returncode=0, checkpointed=True), o, "/ck")  # another node was asked
    assert (asked.action, asked.code, asked.notes) == ("checkpointed", 85, ())
    assert decide_exit(WorkerExit(returncode=0), o, "/ck").action == "finished"


def test_a_failed_node_says_why_its_ranks_said() -> None:
    why = "rank 1 (node 1, host b) has not been heard from for 60 s"
    failed = decide_exit(WorkerExit(returncode=1, error=why), RunOptions(), "/ck")
    assert failed.action == "failed" and failed.message.endswith(f": {why}")


def test_slurm_requeues_a_job_on_many_nodes_from_its_first_task_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
           "PATH": str(tmp_path)}  # fmt: skip
    with caplog.at_level(logging.INFO, logger="ferry.run"):
        assert SlurmAdapter(env=env).after_checkpoint(step=5, code=85, state_dir=str(tmp_path)) == 85
    assert "requeued by task 0 of its 2, not by this one (task 1)" in caplog.text
    assert not (tmp_path / claim_name("7", 0)).exists() and "not on PATH" not in caplog.text
    assert SlurmAdapter(env={"SLURM_JOB_ID": "7"}).step_tasks == (0, 1)  # the batch shell
