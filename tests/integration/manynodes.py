"""Jobs on many nodes, on this machine: one `ferry run` per node, each running its own torchrun
node (static or c10d rendezvous on loopback) of tests/integration/scripts/zc_ddp.py (an
unmodified DDP script on gloo), each with a FERRY_HOME of its own unless a test shares one.
The nodes' processes are told apart by the FERRY_SUPERVISOR_PID every process of a node
inherits from its supervisor."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ferry.runtime.procs import tagged

from reference import shared_root
from trainrun import SCRIPTS, env_for

FERRY = str(Path(sys.executable).parent / "ferry")
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
SCRIPT = str(SCRIPTS / "zc_ddp.py")
EPOCHS = 3
"""36 steps of 8 samples on each of 2 ranks: an epoch is 12 steps."""
TIMEOUT = 240.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_node(
    nodes: int,
    node: int,
    port: int,
    out: Path,
    *,
    rdzv: str = "static",
    procs: int = 1,
    args: Sequence[str] = (),
) -> list[str]:
    """Node ``node`` of ``nodes``: torchrun's command line for the test script."""
    if rdzv == "static":
        where = ["--node_rank", str(node), "--master_addr", "127.0.0.1", "--master_port", str(port)]
    else:
        where = ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "mn"]
    return [TORCHRUN, "--nnodes", str(nodes), "--nproc_per_node", str(procs), *where, *script(out, args)]


def two(port: int, out: Path, *, rdzv: str = "static", args: Sequence[str] = ()) -> list[list[str]]:
    """Both nodes' torchrun command lines, 2 nodes x 1 process."""
    return [torchrun_node(2, n, port, out, rdzv=rdzv, args=args) for n in range(2)]


def one_node(procs: int, out: Path, args: Sequence[str] = ()) -> list[str]:
    """torchrun on one node (``--standalone``) with ``procs`` processes."""
    return [TORCHRUN, "--standalone", "--nproc_per_node", str(procs), *script(out, args)]


def script(out: Path, args: Sequence[str] = ()) -> list[str]:
    return [SCRIPT, "--out", str(out), "--epochs", str(EPOCHS), *args]


@dataclass
class Job:
    """The supervisors of one launch, node by node."""

    procs: list[subprocess.Popen[str]]
    homes: list[Path]
    out: Path
    logs: list[str] = field(default_factory=list)

    def pids(self, node: int) -> list[int]:
        """Every process of node ``node``: its supervisor, torchrun's agent, the ranks."""
        sup = self.procs[node].pid
        return [sup, *tagged(f"FERRY_SUPERVISOR_PID={sup}", outside_group=-1)]

    def signal(self, node: int, signum: int) -> None:
        for pid in self.pids(node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def wait(self, timeout: float = TIMEOUT) -> list[int]:
        """Every supervisor's exit status; their stderr lands in ``logs``."""
        codes = []
        try:
            for p in self.procs:
                _, err = p.communicate(timeout=timeout)
                self.logs.append(err)
                codes.append(p.returncode)
        finally:
            self.kill()
        return codes

    def kill(self) -> None:
        """A failed test leaves no node behind."""
        for node, p in enumerate(self.procs):
            if p.poll() is None:
                self.signal(node, signal.SIGKILL)
                p.communicate()

    def said(self) -> str:
        return "\n".join(f"--- node {i}:\n{log[-3000:]}" for i, log in enumerate(self.logs))

    def steps(self, rank: int = 0) -> int:
        """The last step the rank logged (its log goes on across resumes)."""
        log = self.out / f"rank{rank}" / "log.txt"
        lines = log.read_text().splitlines() if log.exists() else []
        return int(lines[-1].split(" ", 1)[0]) if lines else 0


LAUNCHED: list[Job] = []
"""Every launch of the test session: ``kill_all`` ends what a failed test left running."""


def kill_all() -> None:
    while LAUNCHED:
        LAUNCHED.pop().kill()


def launch(
    tmp: Path,
    commands: list[list[str]],
    *,
    ferry: Sequence[str] = (),
    homes: list[Path] | None = None,
    out: Path,
    env: dict[str, str] | None = None,
) -> Job:
    """One `ferry run` per command (a node), in ``tmp`` (the nodes' shared working folder)."""
    homes = homes or [tmp / f"home{i}" for i in range(len(commands))]
    procs = []
    for home, command in zip(homes, commands, strict=True):
        procs.append(
            subprocess.Popen(
                [FERRY, "run", *ferry, "--", *command],
                cwd=tmp,
                env=env_for(home, OMP_NUM_THREADS="1", **(env or {})),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    job = Job(procs, homes, out)
    LAUNCHED.append(job)
    return job


def wait_until(what: str, ready: Callable[[], bool], job: Job, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if any(p.poll() is not None for p in job.procs) or time.monotonic() > deadline:
            job.kill()
            codes = [p.returncode for p in job.procs]
            logs = "\n".join(
                f"--- node {i}:\n{(p.communicate()[1] or '')[-3000:]}" for i, p in enumerate(job.procs)
            )
            raise AssertionError(f"{what}: not reached (exit codes {codes})\n{logs}")
        time.sleep(0.05)


def held(out: Path, step: int) -> list[str]:
    """The script's arguments that hold every rank after ``step`` until ``release(out)``, and
    make steps 0.1 s long: a stop lands within 5 steps (the ranks agree at least every 0.5 s)."""
    with contextlib.suppress(FileNotFoundError):
        (out.parent / f"release-{out.name}").unlink()
    return ["--hold-at", str(step), "--release", str(out.parent / f"release-{out.name}"), "--sleep", "0.1"]


def release(out: Path) -> None:
    (out.parent / f"release-{out.name}").touch()


def records(out: Path, rank: int) -> dict[str, str]:
    """Each step's line of a rank's log (a resumed run appends; a step's last line counts)."""
    return {
        line.split(" ", 1)[0]: line for line in (out / f"rank{rank}" / "log.txt").read_text().splitlines()
    }


def assert_same(reference: Path, out: Path, ranks: int = 2) -> None:
    """Every rank's per-step losses and the final weights, bit for bit."""
    assert (out / "params.txt").read_text() == (reference / "params.txt").read_text()
    for rank in range(ranks):
        assert records(out, rank) == records(reference, rank)


def plain_reference(factory: pytest.TempPathFactory) -> Path:
    """The script with 2 ranks under plain torchrun, to its end (one node x 2 processes: the
    same ranks, data and reductions as 2 nodes x 1, at one process less to start): made once
    per test session (and pytest-xdist run), under a lock, by the first test that asks."""
    base = shared_root(factory) / "references" / "many-nodes"
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = base / "run"
        if not (base / "complete").exists():
            env = env_for(base / "home", OMP_NUM_THREADS="1")
            done = subprocess.run(one_node(2, out), env=env, capture_output=True, text=True, timeout=TIMEOUT)
            assert done.returncode == 0, done.stderr[-3000:]
            (base / "complete").touch()
    return out
