"""Find ferry jobs by id or PID, and tell whether they are alive (requests to them:
``ferry.ops.requests``).

A job is *alive* when its worker process exists and, under ``ferry run``, its supervisor
or its worker holds the lock; *orphaned* when the worker holds it alone (the supervisor
died). Everything here reads the job directory (docs/jobs.md) and never writes it.
"""

from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass
from typing import TypedDict

from ferry.errors import ConfigError, JobError
from ferry.runtime.jobdir import NODE_SEPARATOR, JobDir, jobs_root
from ferry.runtime.jobfiles import Identity, Status
from ferry.runtime.rootlock import nodes as root_nodes

BUSY_STATES = ("checkpointing",)
"""A save is in flight: requests queue behind it (``requests.send``); ``ferry list`` shows it."""
DONE_STATES = ("checkpointed", "finished", "failed")


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, belongs to someone else
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def process_env(pid: int) -> dict[str, str] | None:
    """The environment a process was started with (/proc/PID/environ), or None if unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return " ".join(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
    except OSError:
        return "?"


class NodeSummary(TypedDict):
    """One node of a job on many nodes, as any of its nodes sees it."""

    node: str
    host: str | None
    alive: bool
    supervisor_pid: int | None
    job_dir: str | None
    """That node's job directory (on that node's FERRY_HOME)."""
    state: str | None
    """Its state, where its job directory is under this FERRY_HOME; None otherwise."""


class JobSummary(TypedDict):
    """One job as ``ferry list`` and ``ferry status`` show it (``--json`` too)."""

    id: str
    node: str | None
    """A job on many nodes: the node this record is (its job directory ``<id>@<node>``)."""
    nodes: int | None
    """A job on many nodes: how many."""
    pid: int | None
    supervisor_pid: int | None
    alive: bool
    state: str
    step: int | None
    command: list[str]
    devices: str | None
    user: str | None
    uid: int | None
    host: str | None
    job_dir: str
    checkpoint_dir: str | None
    last_checkpoint: str | None
    last_checkpoint_step: int | None
    last_checkpoint_age: float | None
    started: float | None
    """When the job's current run started (epoch seconds): ``ferry run``'s start, else the
    session's first record."""


@dataclass
class JobRecord:
    """A snapshot of one job directory, as a controller sees it."""

    id: str
    dir: JobDir
    identity: Identity
    status: Status

    @classmethod
    def load(cls, path: str) -> JobRecord:
        job = JobDir.open(path)
        identity = job.identity()
        return cls(identity.get("id") or os.path.basename(path), job, identity, job.status())

    def refresh(self) -> JobRecord:
        self.identity, self.status = self.dir.identity(), self.dir.status()
        return self

    @property
    def supervised(self) -> bool:
        return bool(self.identity.get("supervisor_pid"))

    @property
    def worker_pid(self) -> int | None:
        pid = self.status.get("worker_pid") or self.identity.get("worker_pid")
        return pid or self.status.get("pid") or self.identity.get("pid")

    @property
    def session_pid(self) -> int | None:
        """The process that runs the ferry session (the worker, or rank 0 under torchrun)."""
        return self.status.get("pid") or self.identity.get("pid")

    @property
    def pids(self) -> set[int]:
        i, s = self.identity, self.status
        found = [i.get("pid"), i.get("worker_pid"), i.get("supervisor_pid")]
        found += [s.get("pid"), s.get("worker_pid"), s.get("supervisor_pid")]
        return {p for p in found if p}

    @property
    def uid(self) -> int | None:
        return self.identity.get("uid")

    @property
    def alive(self) -> bool:
        if self.supervised:  # the supervisor holds the lock for the job's whole life
            return self.dir.is_locked()
        pid = self.worker_pid
        return pid is not None and pid_exists(pid) and self.status.get("state") not in DONE_STATES

    @property
    def orphaned(self) -> bool:
        """Started by ``ferry run``, whose supervisor is gone while its worker lives on (it
        holds the job's lock too): nobody forwards signals to it or restarts it."""
        supervisor = self.identity.get("supervisor_pid")
        return bool(supervisor) and self.alive and not pid_exists(supervisor or 0)

    @property
    def busy(self) -> bool:
        """A checkpoint is being taken. The worker answers a request once the checkpoint is
        recorded, just before it rewrites its state: a recorded checkpoint of the current step
        means that one is done."""
        if self.status.get("state") not in BUSY_STATES:
            return False
        last = self.status.get("last_checkpoint")
        return last is None or last["step"] != self.status.get("step")

    @property
    def state(self) -> str:
        if self.alive:
            return "orphaned" if self.orphaned else self.status.get("state", "?")
        state = self.status.get("state")
        if state in DONE_STATES:
            return str(state)
        return "dead"  # it says running, but nobody is: killed without a word

    def devices(self) -> str | None:
        """The worker's CUDA_VISIBLE_DEVICES: None when unset, '?' when it cannot be read."""
        pid = self.worker_pid
        env = process_env(pid) if pid and self.alive else None
        if env is None:
            return "?"
        return env.get("CUDA_VISIBLE_DEVICES")

    def summary(self) -> JobSummary:
        last = self.status.get("last_checkpoint")
        return {
            "id": self.id,
            "node": self.identity.get("node"),
            "nodes": self.identity.get("nodes"),
            "pid": self.worker_pid,
            "supervisor_pid": self.identity.get("supervisor_pid"),
            "alive": self.alive,
            "state": self.state,
            "step": self.status.get("step"),
            "command": command_of(self),
            "devices": self.devices() if self.alive else None,
            "user": self.identity.get("user"),
            "uid": self.uid,
            "host": self.identity.get("host"),
            "job_dir": self.dir.path,
            "checkpoint_dir": self.identity.get("checkpoint_dir"),
            "last_checkpoint": last["url"] if last else None,
            "last_checkpoint_step": last["step"] if last else None,
            "last_checkpoint_age": time.time() - last["time"] if last else None,
            "started": self.status.get("started") or self.identity.get("created"),
        }


def job_nodes(record: JobRecord) -> list[NodeSummary]:
    """The nodes of a job on many nodes (empty for a job on one): those that hold its local
    checkpoint root (each node's lock there says who and where it is), and those whose job
    directories are under this FERRY_HOME (a home the nodes share), by node name."""
    if record.identity.get("node") is None:
        return []
    found: dict[str, NodeSummary] = {}
    root = record.identity.get("checkpoint_dir")
    for doc in root_nodes(root) if root else []:
        if doc.get("job") != record.id or not isinstance(doc.get("node"), str):
            continue
        pid, job_dir = doc.get("supervisor_pid"), doc.get("job_dir")
        found[doc["node"]] = {
            "node": doc["node"],
            "host": doc.get("host") if isinstance(doc.get("host"), str) else None,
            "alive": bool(doc.get("alive")),
            "supervisor_pid": pid if isinstance(pid, int) else None,
            "job_dir": job_dir if isinstance(job_dir, str) else None,
            "state": None,
        }
    for peer in node_records(record.id):
        node = peer.identity.get("node") or "?"
        if node in found and found[node]["job_dir"] not in (None, peer.dir.path):
            continue  # that node's lock in the root names another folder (another home)
        found[node] = {
            "node": node,
            "host": peer.identity.get("host"),
            "alive": peer.alive,
            "supervisor_pid": peer.identity.get("supervisor_pid"),
            "job_dir": peer.dir.path,
            "state": peer.state,
        }
    return [found[k] for k in sorted(found, key=natural_key)]


def node_records(job_id: str) -> list[JobRecord]:
    """The job directories of job ``job_id``'s nodes under this FERRY_HOME (``<id>@<node>``)."""
    prefix = job_id + NODE_SEPARATOR
    out = []
    for name in job_ids():
        if not name.startswith(prefix):
            continue
        try:
            record = JobRecord.load(os.path.join(jobs_root(), name))
        except (JobError, PermissionError):
            continue
        if record.id == job_id and record.identity.get("node") is not None:
            out.append(record)
    return out


def command_of(record: JobRecord) -> list[str]:
    """The command that started the job: the supervisor's (``run_start``), else the worker's argv."""
    for event in reversed(record.dir.events()):
        if event["event"] == "run_start" and "command" in event:
            return event["command"]
    return record.identity.get("command", [])


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders the numbers inside names by value: job2 before job10."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p)


def job_ids() -> list[str]:
    """The ids of the job directories under jobs_root(), naturally sorted, none opened."""
    try:
        return sorted(os.listdir(jobs_root()), key=natural_key)
    except OSError:
        return []


def list_jobs() -> list[JobRecord]:
    root = jobs_root()
    try:
        names = sorted(os.listdir(root), key=natural_key)
    except FileNotFoundError:
        return []
    except PermissionError as exc:
        raise JobError(f"cannot read {root}: it belongs to another user; run as its owner") from exc
    except NotADirectoryError as exc:
        why = f"cannot list jobs under {root}: a file is in its way; set FERRY_HOME to a folder"
        raise JobError(why) from exc
    out = []
    for name in names:
        try:
            out.append(JobRecord.load(os.path.join(root, name)))
        except (JobError, PermissionError):
            continue
    return out


def not_a_job_message(pid: int) -> str:
    return (
        f"pid {pid} ({process_name(pid)[:60]}) is not a ferry job: it was not started under "
        "`ferry run` and runs no ferry session, so ferry cannot ask it for a framework-level "
        "checkpoint, migrate or export it. For a CUDA process, `ferry process suspend PID` / "
        "`ferry process wake PID --map ...` checkpoint its GPU state at the process level "
        "(`ferry help process`); to make it a ferry job, restart it as `ferry run -- COMMAND`"
    )


def find_job(spec: str) -> JobRecord:
    """A job by its id, or by the PID of its worker, session or supervisor."""
    if not spec or "/" in spec or spec in (".", ".."):
        raise ConfigError(f"{spec!r} is not a job id or a PID")
    path = os.path.join(jobs_root(), spec)
    try:
        os.stat(path)
    except PermissionError:
        raise JobError(
            f"permission denied on {path}: jobs under {jobs_root()} belong to another user, "
            "and only a job's own user may see or control it"
        ) from None
    except FileNotFoundError:
        pass
    if os.path.isfile(os.path.join(path, "job.json")):
        try:
            return JobRecord.load(path)
        except PermissionError as exc:
            raise JobError(f"job {spec} belongs to another user: only its own user may control it") from exc
    if os.path.isdir(path) and not os.access(path, os.R_OK | os.X_OK):
        raise JobError(f"job {spec} belongs to another user: only its own user may control it")
    nodes = node_records(spec)
    if nodes:  # a job on many nodes: any live node's supervisor takes a request for the whole job
        return max(
            nodes,
            key=lambda r: (
                r.alive,
                r.identity.get("host") == socket.gethostname(),
                r.status.get("updated", 0),
            ),
        )
    if spec.isdigit():
        pid = int(spec)
        matches = [r for r in list_jobs() if pid in r.pids]
        live = [r for r in matches if r.alive]
        if live or matches:
            return (live or matches)[-1]
        if pid_exists(pid):
            raise JobError(not_a_job_message(pid))
        raise JobError(f"no process {pid} and no ferry job with that id or pid: see `ferry list`")
    raise JobError(f"no ferry job {spec!r} under {jobs_root()} (FERRY_HOME): see `ferry list`")
