"""The job directory: identity, status, lock and control requests of one job.

Layout (documented in docs/jobs.md), mode 0700, owned by the job's user::

    <FERRY_HOME>/jobs/<job-id>/
        job.json       id, pid, host, user, command, checkpoint dir, start time
        status.json    state, step, timestamps, last checkpoints (rewritten atomically)
        lock           flock'ed while the job runs: by `ferry run` and its worker (which inherits
                       it, so that it stays held while either lives), or by a worker started without it
        control/       requests (req-*.json) and responses (resp-*.json)
        events.jsonl   one line per event (checkpoint, resume, stop, failure)
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import stat
import threading
import time
from typing import TYPE_CHECKING, Any

from ferry.errors import JobError
from ferry.runtime.atomicjson import write_json_atomic
from ferry.runtime.events import Event, EventLog, read_events
from ferry.runtime.jobfiles import (
    STATES,
    CheckpointRecord,
    Identity,
    Saving,
    Status,
    StatusUpdate,
    parse_identity,
    parse_status,
)
from ferry.typedjson import loads

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("ferry")

MAX_DOC_BYTES = 1 << 20
"""job.json, status.json, a control file: a few KiB when ferry writes them (status.json
keeps 50 checkpoints). A bigger one is not ferry's, and is not read."""


def ferry_home() -> str:
    base = os.environ.get("FERRY_HOME")
    if base:
        return base
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "ferry")


def jobs_root() -> str:
    return os.path.join(ferry_home(), "jobs")


NODE_SEPARATOR = "@"


def node_dir_name(job_id: str, node: str) -> str:
    """The job directory's name of one node of a job on many nodes: ``<job id>@<node>``, so
    that the nodes of one job share a FERRY_HOME (a shared home folder) without sharing a
    directory; each holds its node's supervisor, status, requests and events."""
    return f"{job_id}{NODE_SEPARATOR}{node}"


def dir_problem(st: os.stat_result, uid: int) -> str | None:
    """Why a directory with ``lstat`` result ``st`` is not one this user alone controls
    (None when it is): a symlink may lead anywhere, another owner or a group/world write
    bit lets someone else plant or swap files in it."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & 0o022:
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def private_dir(path: str, what: str, *, tighten: bool = False) -> None:
    """Create ``path`` (0700), or check that the existing one is this user's own: JobError,
    naming the problem and the fix, instead of following it. ``tighten``: make an existing
    one 0700 too (a job's own folders; FERRY_HOME keeps the mode its user gave it)."""
    try:
        os.mkdir(path, 0o700)
        return
    except FileExistsError:
        pass
    problem = dir_problem(os.lstat(path), os.geteuid())
    if problem is not None:
        raise JobError(
            f"{what} {path} {problem}: ferry does not use it; remove it, or set FERRY_HOME "
            "to a folder of your own"
        )
    if tighten:
        os.chmod(path, 0o700)


def read_json(path: str, limit: int = MAX_DOC_BYTES, owner: int | None = None) -> Any:
    """The decoded JSON of the regular file ``path``, for its caller to parse. A symlink
    (OSError), a FIFO or device (which could hang the reader), a file over ``limit`` bytes,
    one not owned by uid ``owner`` (when given) and bytes that are not JSON or nest too deep
    (ValueError) are refused; FileNotFoundError and PermissionError come through as they are.
    The checks are made on the opened file, so a file swapped in after a caller's ``lstat`` is
    caught too."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if owner is not None and st.st_uid != owner:
            raise ValueError(f"{path} is owned by uid {st.st_uid}, not by uid {owner}")
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{path} holds {st.st_size} bytes, more than the {limit} ferry reads")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{path} holds more than the {limit} bytes ferry reads")
    return loads(data)


_reported: set[str] = set()


def report_dropped(problem: str) -> None:
    """Log a malformed field of a job file once per process, not at every poll of it."""
    if problem in _reported:
        return
    if len(_reported) >= 1000:  # bounded: a job dir full of garbage must not grow memory
        _reported.clear()
    _reported.add(problem)
    log.warning("ferry: %s", problem)


def _own(path: str) -> dict[str, object]:
    """A file this process rewrites, every field kept (those of other ferry versions too)."""
    try:
        doc = read_json(path)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        report_dropped(f"{path} is unreadable ({exc}); it is written anew")
        return {}
    return doc if isinstance(doc, dict) else {}


def _read(path: str) -> object:
    """A job file's JSON; an empty object when it is missing (not written yet: no warning)
    or cannot be read (said once in the log). PermissionError comes through: the job
    belongs to another user."""
    try:
        return read_json(path)
    except FileNotFoundError:
        return {}
    except PermissionError:
        raise
    except (OSError, ValueError) as exc:
        report_dropped(f"{path} is unreadable ({exc}); ignored")
        return {}


class JobDir:
    """One job's directory. The worker writes; controllers read and drop requests."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.control = os.path.join(path, "control")
        self._lock_fd: int | None = None
        self._mutex = threading.Lock()
        self.writer = True
        """False on ranks other than 0 of a multi-rank job: one rank speaks for the job."""
        self.event = EventLog(self.file("events.jsonl"), lambda: self.writer, self._mutex)
        """``event("kind", field=...)`` appends one line to ``events.jsonl`` (events.py
        declares each kind's fields)."""

    @classmethod
    def create(cls, job_id: str, path: str | None = None, *, name: str | None = None) -> JobDir:
        """The job directory, created 0700 where it is missing. FERRY_HOME, ``jobs/`` (when
        the directory is the default one), the directory and its ``control/`` must each be
        a real directory of this user that nobody else may write: JobError otherwise.
        ``name``: the folder's name under ``jobs/`` when not the job id (one node's of a job
        on many nodes: ``node_dir_name``)."""
        if path is None:
            home = ferry_home()
            os.makedirs(os.path.dirname(os.path.abspath(home)), mode=0o700, exist_ok=True)
            private_dir(home, "FERRY_HOME")
            private_dir(os.path.join(home, "jobs"), "the jobs folder")
            path = os.path.join(home, "jobs", name or job_id)
        else:
            os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
        private_dir(path, "the job directory", tighten=True)
        private_dir(os.path.join(path, "control"), "the job's control folder", tighten=True)
        return cls(path)

    @classmethod
    def open(cls, path: str) -> JobDir:
        if not os.path.isfile(os.path.join(path, "job.json")):
            raise JobError(f"{path} is not a ferry job directory (no job.json)")
        return cls(path)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    # ----------------------------------------------------------------- worker side
    def write_identity(self, **fields: Unpack[Identity]) -> None:
        if not self.writer:
            return
        existing = _own(self.file("job.json"))
        doc = {"host": socket.gethostname(), "uid": os.getuid(), "created": time.time(), **existing, **fields}
        write_json_atomic(self.file("job.json"), doc)

    def acquire_lock(self) -> None:
        fd = os.open(self.file("lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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

    @property
    def lock_fd(self) -> int | None:
        """The held lock's descriptor: a child that inherits it holds the lock as well."""
        return self._lock_fd

    def release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def update_status(self, state: str, **fields: Unpack[StatusUpdate]) -> None:
        if state not in STATES:
            raise JobError(f"unknown job state {state!r}; the states are: {', '.join(STATES)}")
        if not self.writer:
            return
        with self._mutex:
            doc = _own(self.file("status.json"))
            doc.update(fields, state=state, updated=time.time())
            write_json_atomic(self.file("status.json"), doc)

    def record_checkpoint(self, entry: CheckpointRecord, keep: int = 50) -> None:
        if not self.writer:
            return
        with self._mutex:
            doc = _own(self.file("status.json"))
            kept = parse_status(doc, report_dropped, self.file("status.json")).get("checkpoints", [])
            history = [*kept, entry][-keep:]
            doc.update(checkpoints=history, last_checkpoint=entry, updated=time.time())
            write_json_atomic(self.file("status.json"), doc)

    def save_progress(self, saving: Saving | None) -> None:
        """The save in flight (``Status.saving``), or None once it ended. The state and
        ``updated`` are kept: the supervisor and ``ferry report`` time the job's last state by it."""
        if not self.writer:
            return
        with self._mutex:
            doc = _own(self.file("status.json"))
            if saving is None:
                if doc.pop("saving", None) is None:
                    return
            else:
                doc["saving"] = dict(saving)
            write_json_atomic(self.file("status.json"), doc)

    # ----------------------------------------------------------------- reader side
    def identity(self) -> Identity:
        """``job.json``, its well-formed fields; {} when it is missing or unreadable."""
        return parse_identity(_read(self.file("job.json")), report_dropped, self.file("job.json"))

    def status(self) -> Status:
        """``status.json``, its well-formed fields; {} when it is missing or unreadable."""
        return parse_status(_read(self.file("status.json")), report_dropped, self.file("status.json"))

    def events(self) -> list[Event]:
        """The well-formed lines of ``events.jsonl``, oldest first; the others are skipped."""
        return read_events(self.file("events.jsonl"), report_dropped)

    def is_locked(self) -> bool:
        """True while a live worker holds the lock."""
        try:
            fd = os.open(self.file("lock"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a symlink is no lock of a ferry worker's
                return False
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False
