"""The lock of a local checkpoint root: one live job writes a root at a time, on one node or
on many.

Retention deletes every checkpoint of a root beyond the newest few, whoever saved them, so
two jobs writing one root delete each other's checkpoints. ``ferry run`` takes this lock
(``<root>/.ferry-lock``, flock'ed, holding the job id) before its worker starts, and the
worker inherits it, so that it stays held while either lives. Remote roots (URLs) have no
flock and are not locked.

A job on many nodes (one ``ferry run`` per node, on a shared filesystem) holds the root's
lock *shared*: the supervisors of the same job id each take it, a different job is refused
as before. Each node also holds a lock of its own, ``.ferry-node-<node>`` (exclusive,
holding who and where that node's supervisor is), so that two supervisors cannot both be
one node of the job, and so that any node can list the job's nodes (``nodes``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Mapping
from typing import Any

from ferry.errors import JobError
from ferry.typedjson import loads

LOCK_NAME = ".ferry-lock"
"""Outside the checkpoint names (``step-*``) and the staging prefix: the catalog ignores it."""
NODE_PREFIX = ".ferry-node-"
"""A node's own lock and record, beside the root's lock."""
MAX_ID_BYTES = 4096
SHARE_WAIT_SECONDS = 5.0
"""How long a node waits for a peer that holds the root's lock exclusively for an instant
(while it turns its first exclusive hold into a shared one) before it gives up."""
HOST_SLOTS = 64
"""Node locks named by a host tried in turn (several nodes of one job on one host)."""


class RootLock:
    """A held lock on a checkpoint root; ``release`` lets it go. A root that holds nothing
    else when the lock is released (a command that saved nothing) is left as it was found."""

    def __init__(self, root: str, fd: int, created: list[str]) -> None:
        self.root, self.path, self.created = root, os.path.join(root, LOCK_NAME), created
        self.fd: int | None = fd
        """Pass it on to the worker (``pass_fds``): the lock is held while any holder lives."""
        self.node_fd: int | None = None
        """A node's own lock (a job on many nodes), passed on to the worker as well."""
        self.node_path: str | None = None

    @classmethod
    def acquire(cls, root: str, job_id: str) -> RootLock | None:
        """Lock the local root ``root`` for ``job_id`` (None for a remote root); JobError
        naming the holder when a live job holds it."""
        if "://" in root:
            return None
        created = _missing(root)
        os.makedirs(root, exist_ok=True)
        path = os.path.join(root, LOCK_NAME)
        while True:
            fd = _open(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise JobError(_refusal(root, holder)) from None
            if _same_file(fd, path):
                break
            os.close(fd)  # its holder removed it on release, after we opened it: again
        os.ftruncate(fd, 0)
        os.pwrite(fd, job_id.encode(), 0)
        return cls(root, fd, created)

    @classmethod
    def share(
        cls, root: str, job_id: str, node: str, record: Mapping[str, Any], *, exact: bool
    ) -> RootLock | None:
        """Lock the local root ``root`` for node ``node`` of the job ``job_id`` on many nodes
        (None for a remote root): shared with the job's other nodes, refused to another job
        (JobError naming it), and to a second supervisor of the same node when ``exact`` (the
        node's index is known); otherwise (a node named by its host) the next free slot of
        that host is taken. ``record`` (who, where) is written into the node's lock."""
        if "://" in root:
            return None
        created = _missing(root)
        os.makedirs(root, exist_ok=True)
        fd = _shared(root, job_id)
        lock = cls(root, fd, created)
        try:
            lock.node_fd, lock.node_path = _node_lock(root, job_id, node, record, exact=exact)
        except BaseException:
            lock.release()
            raise
        return lock

    def release(self) -> None:
        if self.node_fd is not None and self.node_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.node_path)  # while held: nobody takes a lock on it meanwhile
            os.close(self.node_fd)
            self.node_fd = None
        if self.fd is None:
            return
        with contextlib.suppress(OSError):  # still held: nobody can take it meanwhile
            if os.listdir(self.root) == [LOCK_NAME]:
                os.unlink(self.path)
                for folder in self.created:  # the root first, then its parents made for it
                    os.rmdir(folder)
        os.close(self.fd)
        self.fd = None

    @property
    def fds(self) -> tuple[int, ...]:
        """The descriptors the worker inherits, so that the locks live as long as it does."""
        return tuple(fd for fd in (self.fd, self.node_fd) if fd is not None)


def nodes(root: str) -> list[dict[str, Any]]:
    """The nodes of the job on many nodes that holds the local root ``root``, as each wrote
    itself into its lock (``node``, ``host``, ``supervisor_pid``, ``job_dir``, ...), with
    ``alive``: its lock is held. Empty for a remote root, or a root no such job holds."""
    if "://" in root:
        return []
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith(NODE_PREFIX))
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(root, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue  # a FIFO or a device: not a node's lock
            raw = os.pread(fd, MAX_ID_BYTES, 0)
            alive = _held(fd)
        finally:
            os.close(fd)
        try:
            doc = loads(raw)
        except ValueError:
            continue  # being written, or not ferry's
        if isinstance(doc, dict):
            found.append({**{k: v for k, v in doc.items() if isinstance(k, str)}, "alive": alive})
    return found


def _shared(root: str, job_id: str) -> int:
    """The root's lock, held shared with the other nodes of ``job_id``."""
    path = os.path.join(root, LOCK_NAME)
    deadline = time.monotonic() + SHARE_WAIT_SECONDS
    while True:
        fd = _open(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass
        else:  # the first node: name the job, then let the others in
            if not _same_file(fd, path):
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, job_id.encode(), 0)
            fcntl.flock(fd, fcntl.LOCK_SH)
        holder = _holder(fd, raw=True)
        if holder not in (job_id, ""):
            os.close(fd)
            raise JobError(_refusal(root, repr(holder) if " " in holder else holder))
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held exclusively: a one-node run, or a peer turning its hold shared
            os.close(fd)
            if time.monotonic() > deadline:
                raise JobError(
                    f"the checkpoint root {root} is held by a run of job {job_id} on one node: stop it "
                    f"first (`ferry checkpoint --stop {job_id}`), then start the job on all its nodes"
                ) from None
            time.sleep(0.05)
            continue
        if _same_file(fd, path) and _holder(fd, raw=True) == job_id:
            return fd
        os.close(fd)  # removed on release, or named by a peer in between: look again


def _node_lock(
    root: str, job_id: str, node: str, record: Mapping[str, Any], *, exact: bool
) -> tuple[int, str]:
    """This node's own lock in the root: its descriptor and path."""
    for slot in range(1 if exact else HOST_SLOTS):
        name = node if slot == 0 else f"{node}-{slot + 1}"
        path = os.path.join(root, NODE_PREFIX + name)
        fd = _open(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, MAX_ID_BYTES, 0)
            os.close(fd)
            if exact:
                raise JobError(
                    f"{name} of job {job_id} is already running ({_who(holder)}): two supervisors for one "
                    f"node; stop that one first, or give this node another rank"
                ) from None
            continue
        if not _same_file(fd, path):
            os.close(fd)
            return _node_lock(root, job_id, node, record, exact=exact)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({**record, "job": job_id, "node": name}).encode(), 0)
        return fd, path
    raise JobError(f"job {job_id} already runs {HOST_SLOTS} nodes on host {node}: no node lock left")


def _who(raw: bytes) -> str:
    try:
        doc = loads(raw)
    except ValueError:
        return "a live supervisor"
    if not isinstance(doc, dict):
        return "a live supervisor"
    return f"on {doc.get('host', '?')}, ferry run pid {doc.get('supervisor_pid', '?')}"


def _refusal(root: str, holder: str) -> str:
    return (
        f"the checkpoint root {root} is being written by the live job {holder}: two "
        "jobs writing one root delete each other's checkpoints; give this one another "
        f"--dir, or stop that job first (`ferry checkpoint --stop {holder}`)"
    )


def _open(path: str) -> int:
    """The lock file ``path``, created 0600 where missing. The root may be a shared folder: a
    symlink planted there is not followed, nor is anything but a regular file used (a FIFO,
    a folder): JobError, saying what to do."""
    fix = "ferry does not use it as a lock; remove it, then start the job again"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise JobError(f"{path} is a symbolic link: {fix}") from None
        if exc.errno == errno.EISDIR:
            raise JobError(f"{path} is a folder: {fix}") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise JobError(f"{path} is not a regular file: {fix}")
    return fd


def _held(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _missing(root: str) -> list[str]:
    """The folders ``makedirs(root)`` is about to create, the deepest first."""
    out = []
    path = os.path.abspath(root)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        out.append(path)
        path = os.path.dirname(path)
    return out


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _holder(fd: int, *, raw: bool = False) -> str:
    """The job id in the lock; ``raw``: as written ('' when empty), else fit for a message."""
    text = ""
    with contextlib.suppress(OSError):
        text = os.pread(fd, MAX_ID_BYTES, 0).decode("utf-8", "replace").strip()
    if raw:
        return text
    if text and text.isprintable():
        return repr(text) if " " in text else text
    return "(unknown id)"
