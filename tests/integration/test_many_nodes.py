"""Issue 29: `ferry run -- torchrun --nnodes N` on many nodes works as it is. Two `ferry run`
supervisors on this machine, each with its own torchrun node on loopback (static and c10d
rendezvous) and, unless said, its own FERRY_HOME, and one checkpoint root (a shared
filesystem): one job, one outcome on every node, operable from any node; a dead or stalled
node fails the job, named; a root on each node's own disk is refused at start. Every resume
is bitwise equal to the plain run (every rank's losses and the weights), on 2 nodes x 1
process and on 1 node x 2 processes."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from ferry.cli import main
from ferry.runtime.jobdir import JobDir

from manynodes import (
    Job,
    assert_same,
    free_port,
    held,
    kill_all,
    launch,
    one_node,
    plain_reference,
    release,
    torchrun_node,
    two,
    wait_until,
)
from trainrun import env_for

pytestmark = pytest.mark.integration
CHECKPOINTED = 85


@pytest.fixture(autouse=True)
def no_node_left() -> Iterator[None]:
    """Whatever a test leaves running (it failed half-way) is killed, node by node."""
    yield
    kill_all()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return plain_reference(tmp_path_factory)


def ferry(home: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env=env_for(home))
    return result.exit_code, result.output


def status(home: Path, name: str) -> dict[str, object]:
    return dict(JobDir(str(home / "jobs" / name)).status())


def stopped_cleanly(job: Job) -> None:
    """Every node exits 85 (checkpointed) and says so; no torchrun traceback anywhere."""
    assert job.wait() == [CHECKPOINTED, CHECKPOINTED], job.said()
    for log in job.logs:
        assert "Traceback" not in log and "SignalException" not in log, log[-3000:]
        assert log.strip().splitlines()[-1].endswith("exit 85"), log[-3000:]


def stop_at(job: Job, step: int, stop: object) -> None:
    """Once the ranks hold after ``step``, ``stop()``; then let them go on: they stop at the
    ranks' next agreement."""
    wait_until(f"step {step}", lambda: job.steps() >= step, job)
    if callable(stop):
        stop()
    time.sleep(0.5)  # a supervisor forwards a signal at its next wake-up
    release(job.out)


def test_two_nodes_uninterrupted_with_no_ferry_options_equal_plain_torchrun(
    tmp_path: Path, reference: Path
) -> None:
    """`ferry run -- torchrun --nnodes 2 ... --rdzv_backend c10d` on each node with no option,
    and one FERRY_HOME for both (a shared home): both nodes name the job alike from torchrun's
    rendezvous (and so its checkpoint root), `ferry list` shows both, a checkpoint is saved
    every 10 steps, and the job ends as plain torchrun does: exit 0 on both, bitwise."""
    port, out, home = free_port(), tmp_path / "run", tmp_path / "home"
    job = launch(tmp_path, two(port, out, rdzv="c10d", args=held(out, 5)), homes=[home, home], out=out,
                 env={"FERRY_EVERY_STEPS": "10"})  # fmt: skip
    wait_until("step 5", lambda: job.steps() >= 5, job)
    name = f"torchrun-mn-127.0.0.1-{port}"
    _, listed = ferry(home, "list", "--json")
    jobs = json.loads(listed)["jobs"]
    assert [j["id"] for j in jobs] == [name, name] and all(j["nodes"] == 2 for j in jobs), listed
    assert sorted(f"{name}@{j['node']}" for j in jobs) == sorted(p.name for p in (home / "jobs").iterdir())
    release(out)
    assert job.wait() == [0, 0], job.said()
    for log in job.logs:
        assert "Traceback" not in log and log.strip().splitlines()[-1].endswith("the worker finished; exit 0")
    root = tmp_path / "ferry-checkpoints" / name
    assert sorted(p.name for p in root.glob("step-*")) == [f"step-0000000000{n}" for n in (10, 20, 30)]
    assert {status(home, p.name)["state"] for p in (home / "jobs").iterdir()} == {"finished"}
    assert_same(reference, out)


def test_stops_from_any_node_then_resumes_on_two_nodes_and_on_one(tmp_path: Path, reference: Path) -> None:
    """Static rendezvous, a FERRY_HOME per node, no ferry option (`srun ferry run -- torchrun`).
    1: SIGTERM to node 1's supervisor: both nodes stop at one step and exit 85. 2: resumed on 2
    nodes; `ferry status` and `ferry list` on node 1 show the job and its nodes; `ferry
    checkpoint --stop` from node 1 stops the whole job. 3: resumed, SIGTERM to every node. 4:
    resumed on 1 node x 2 processes, to the end: bitwise equal to the plain run."""
    port, out = free_port(), tmp_path / "run"
    name = f"torchrun-127.0.0.1-{port}"
    root = tmp_path / "ferry-checkpoints" / name

    first = launch(tmp_path, two(port, out, args=held(out, 5)), out=out)
    stop_at(first, 5, lambda: first.procs[1].send_signal(signal.SIGTERM))
    stopped_cleanly(first)
    assert "checkpointed on SIGTERM" in first.logs[1] and "checkpointed and stopped" in first.logs[0]
    (saved,) = root.glob("step-*")
    assert sorted(f.name for f in saved.iterdir()) == [
        "data-0.bin",
        "manifest.json",
        "rank-1.bin",
        "rank-1.json",
    ]

    resumed = int(str(status(first.homes[1], f"{name}@node1")["step"]))
    second = launch(tmp_path, two(port, out, args=held(out, resumed + 2)), out=out)
    node1 = second.homes[1]

    def from_node_one() -> None:
        code, shown = ferry(node1, "status", name)
        # "resumed at step N" until the resumed worker's first status beat says "running"
        head = f"job {name} on 2 nodes (this is node1): "
        assert code == 0 and (f"{head}running" in shown or f"{head}resumed at step" in shown), shown
        assert "node0" in shown and "(this one)" in shown, shown
        _, listed = ferry(node1, "list", "--json")
        (row,) = json.loads(listed)["jobs"]
        assert row["id"] == name and row["node"] == "node1" and row["nodes"] == 2, listed
        code, asked = ferry(node1, "checkpoint", name, "--stop")
        assert code == 0 and "stop requested" in asked, asked

    stop_at(second, resumed + 2, from_node_one)
    stopped_cleanly(second)
    assert status(node1, f"{name}@node1")["state"] == "checkpointed"

    resumed = int(str(status(node1, f"{name}@node1")["step"]))
    third = launch(tmp_path, two(port, out, args=held(out, resumed + 2)), out=out)
    stop_at(third, resumed + 2, lambda: [p.send_signal(signal.SIGTERM) for p in third.procs])
    stopped_cleanly(third)
    assert all("checkpointed on SIGTERM" in log for log in third.logs)
    step = status(node1, f"{name}@node1")["step"]

    one = launch(tmp_path, [one_node(2, out)], ferry=("--dir", str(root)), out=out)
    assert one.wait() == [0], one.said()
    assert f"at step {step}" in one.logs[0]
    assert_same(reference, out)


def test_a_killed_node_and_a_stalled_node_end_the_job_naming_it(tmp_path: Path) -> None:
    """Node 1 SIGKILLed (every process of it): node 0 fails within seconds. Node 1 SIGSTOPped:
    node 0 fails within the stall time (FERRY_STALL_SECONDS=3), naming rank 1 and its node,
    instead of waiting for the process group's 30 minutes; once node 1 runs again, it fails
    too: no node waits on."""
    out, ck = tmp_path / "run", tmp_path / "ck"
    opts, env = ("--job-id", "kj", "--dir", str(ck)), {"FERRY_STALL_SECONDS": "3"}
    killed = launch(tmp_path, two(free_port(), out, args=held(out, 5)), ferry=opts, out=out, env=env)
    t0 = [0.0]
    stop_at(killed, 5, lambda: (killed.signal(1, signal.SIGKILL), t0.append(time.monotonic())))
    _, err = killed.procs[0].communicate(timeout=120)
    assert killed.procs[0].returncode not in (0, CHECKPOINTED), err
    assert time.monotonic() - t0[-1] < 30, err
    assert "Connection closed by peer" in err.strip().splitlines()[-1], err[-3000:]
    killed.kill()

    out = tmp_path / "run2"  # a log of its own: the steps of this launch only
    stalled = launch(tmp_path, two(free_port(), out, args=held(out, 5)), ferry=opts, out=out, env=env)
    stop_at(stalled, 5, lambda: (stalled.signal(1, signal.SIGSTOP), t0.append(time.monotonic())))
    try:
        _, err = stalled.procs[0].communicate(timeout=120)
        waited = time.monotonic() - t0[-1]
    finally:
        stalled.signal(1, signal.SIGCONT)
    assert stalled.procs[0].returncode not in (0, CHECKPOINTED), err
    assert waited < 30, (waited, err)
    last = err.strip().splitlines()[-1]
    assert "rank 1 (node 1, host" in last and "has not been heard from for 3 s" in last, err[-3000:]
    _, err1 = stalled.procs[1].communicate(timeout=120)
    assert stalled.procs[1].returncode not in (0, CHECKPOINTED), err1


def test_node_local_roots_are_refused_at_start(tmp_path: Path) -> None:
    """A --dir on each node's own disk (two folders here): the ranks find out at their first
    agreement that rank 1 cannot see what rank 0 writes, and every node ends with a line
    saying so, instead of training on with every save failing."""
    port, out = free_port(), tmp_path / "run"
    nodes = [
        launch(
            tmp_path,
            [torchrun_node(2, n, port, out)],
            homes=[tmp_path / f"home{n}"],
            out=out,
            ferry=("--job-id", "local", "--dir", str(tmp_path / f"disk{n}")),
        )
        for n in range(2)
    ]
    codes = [job.wait()[0] for job in nodes]
    said = [job.logs[0] for job in nodes]
    assert all(code not in (0, CHECKPOINTED) for code in codes), said
    for log in said:
        last = log.strip().splitlines()[-1]
        assert "is not shared by the job's nodes: rank 1 (node 1) cannot see" in last, log[-3000:]
    assert not list(tmp_path.glob("disk*/step-*"))
