"""The job directory: identity, status, lock and control requests of one job.

Layout (documented in docs/jobs.md), mode 0700, owned by the job's user::

    <FERRY_HOME>/jobs/<job-id>/
        job.json       id, pid, host, user, command, checkpoint dir, start time
        status.json    state, step, timestamps, last checkpoints (rewritten atomically)
        lock           flock'ed while the job runs: by `ferry run`, or by a worker started without it
        control/       requests (req-*.json) and responses (resp-*.json)
        events.jsonl   one line per event (checkpoint, resume, stop, failure)
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
from typing import Any

from ferry.errors import JobError

STATES = ("starting", "running", "checkpointing", "checkpointed", "resumed", "finished", "failed")


def ferry_home() -> str:
    base = os.environ.get("FERRY_HOME")
    if base:
        return base
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "ferry")


def jobs_root() -> str:
    return os.path.join(ferry_home(), "jobs")


def write_json_atomic(path: str, doc: Any) -> None:
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True, default=str)
    os.replace(tmp, path)


def read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


class JobDir:
    """One job's directory. The worker writes; controllers read and drop requests."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.control = os.path.join(path, "control")
        self._lock_fd: int | None = None
        self._mutex = threading.Lock()
        self.writer = True
        """False on ranks other than 0 of a multi-rank job: one rank speaks for the job."""

    @classmethod
    def create(cls, job_id: str, path: str | None = None) -> JobDir:
        path = path or os.path.join(jobs_root(), job_id)
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
        os.makedirs(os.path.join(path, "control"), mode=0o700, exist_ok=True)
        return cls(path)

    @classmethod
    def open(cls, path: str) -> JobDir:
        if not os.path.isfile(os.path.join(path, "job.json")):
            raise JobError(f"{path} is not a ferry job directory (no job.json)")
        return cls(path)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    # ----------------------------------------------------------------- worker side
    def write_identity(self, **fields: Any) -> None:
        if not self.writer:
            return
        existing = self.identity() if os.path.exists(self.file("job.json")) else {}
        doc = {"host": socket.gethostname(), "uid": os.getuid(), "created": time.time(), **existing, **fields}
        write_json_atomic(self.file("job.json"), doc)

    def acquire_lock(self) -> None:
        fd = os.open(self.file("lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JobError(
                f"another process holds {self.file('lock')}: the job is already "
                "running; stop it first or use another job id"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def update_status(self, state: str, **fields: Any) -> dict[str, Any]:
        assert state in STATES, state
        if not self.writer:
            return {}
        with self._mutex:
            doc = self.status()
            doc.update(fields, state=state, updated=time.time())
            write_json_atomic(self.file("status.json"), doc)
            return doc

    def record_checkpoint(self, entry: dict[str, Any], keep: int = 50) -> None:
        if not self.writer:
            return
        with self._mutex:
            doc = self.status()
            history = [*doc.get("checkpoints", []), entry][-keep:]
            doc.update(checkpoints=history, last_checkpoint=entry, updated=time.time())
            write_json_atomic(self.file("status.json"), doc)

    def event(self, kind: str, **fields: Any) -> None:
        if not self.writer:
            return
        line = json.dumps({"time": time.time(), "event": kind, **fields}, default=str)
        with self._mutex, open(self.file("events.jsonl"), "a") as f:
            f.write(line + "\n")

    # ----------------------------------------------------------------- reader side
    def identity(self) -> dict[str, Any]:
        try:
            doc = read_json(self.file("job.json"))
            return doc if isinstance(doc, dict) else {}
        except (FileNotFoundError, ValueError):
            return {}

    def status(self) -> dict[str, Any]:
        try:
            doc = read_json(self.file("status.json"))
            return doc if isinstance(doc, dict) else {}
        except (FileNotFoundError, ValueError):
            return {}

    def events(self) -> list[dict[str, Any]]:
        try:
            with open(self.file("events.jsonl")) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def is_locked(self) -> bool:
        """True while a live worker holds the lock."""
        try:
            fd = os.open(self.file("lock"), os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False
