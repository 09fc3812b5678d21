"""The lock of a local checkpoint root: one live job writes a root at a time.

Retention deletes every checkpoint of a root beyond the newest few, whoever saved them, so
two jobs writing one root delete each other's checkpoints. ``ferry run`` takes this lock
(``<root>/.ferry-lock``, flock'ed, holding the job id) before its worker starts, and the
worker inherits it, so that it stays held while either lives. Remote roots (URLs) have no
flock and are not locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

from ferry.errors import JobError

LOCK_NAME = ".ferry-lock"
"""Outside the checkpoint names (``step-*``) and the staging prefix: the catalog ignores it."""
MAX_ID_BYTES = 4096


class RootLock:
    """A held lock on a checkpoint root; ``release`` lets it go. A root that holds nothing
    else when the lock is released (a command that saved nothing) is left as it was found."""

    def __init__(self, root: str, fd: int, created: list[str]) -> None:
        self.root, self.path, self.created = root, os.path.join(root, LOCK_NAME), created
        self.fd: int | None = fd
        """Pass it on to the worker (``pass_fds``): the lock is held while any holder lives."""

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
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise JobError(
                    f"the checkpoint root {root} is being written by the live job {holder}: two "
                    "jobs writing one root delete each other's checkpoints; give this one another "
                    f"--dir, or stop that job first (`ferry checkpoint --stop {holder}`)"
                ) from None
            if _same_file(fd, path):
                break
            os.close(fd)  # its holder removed it on release, after we opened it: again
        os.ftruncate(fd, 0)
        os.pwrite(fd, job_id.encode(), 0)
        return cls(root, fd, created)

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):  # still held: nobody can take it meanwhile
            if os.listdir(self.root) == [LOCK_NAME]:
                os.unlink(self.path)
                for folder in self.created:  # the root first, then its parents made for it
                    os.rmdir(folder)
        os.close(self.fd)
        self.fd = None


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


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError):
        raw = os.pread(fd, MAX_ID_BYTES, 0).decode("utf-8", "replace").strip()
        if raw and raw.isprintable():
            return repr(raw) if " " in raw else raw
    return "(unknown id)"
