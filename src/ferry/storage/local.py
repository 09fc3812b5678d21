"""Local filesystem backend: direct os calls, fsync for durability, atomic rename.

Implements the core ``Storage`` and both capabilities, ``AtomicRename`` and ``LocalFiles``.
"""

from __future__ import annotations

import errno
import os
import shutil

from ferry.errors import StorageError


def storage_error(exc: OSError, what: str) -> StorageError:
    """Turn an OSError into a one-line error that names the fix."""
    if exc.errno == errno.ENOSPC:
        hint = "the disk is full; free space or point ferry at another location"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        hint = "permission denied; check the folder's owner and mode"
    elif exc.errno == errno.EROFS:
        hint = "the filesystem is read-only; choose a writable location"
    else:
        hint = exc.strerror or str(exc)
    return StorageError(f"{what}: {hint}")


def fsync_dir(path: str) -> None:
    """Make a folder's entries durable (the names of the files in it, not only their bytes).

    The one place ferry does this: after a rename, and before a commit for each folder that
    a checkpoint's files were written to."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise storage_error(exc, f"cannot flush {path}") from exc


class LocalWriter:
    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as exc:
            raise storage_error(exc, f"cannot create {path}") from exc

    def write(self, data: memoryview | bytes) -> None:
        if self._fd is None:
            raise StorageError(f"cannot write {self.path}: its writer was closed (a failed write aborted it)")
        view = memoryview(data).cast("B")
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError as exc:
            self.abort()
            raise storage_error(exc, f"cannot write {self.path}") from exc

    def close(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            raise storage_error(exc, f"cannot flush {self.path}") from exc
        os.close(fd)

    def abort(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class LocalStorage:
    atomic_rename = True

    def __init__(self, url: str) -> None:
        self.url = url
        self.root = os.path.abspath(os.path.expanduser(url.removeprefix("file://")))

    def _p(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root

    def child_url(self, rel: str) -> str:
        return self._p(rel)

    def local_path(self, rel: str) -> str:
        return self._p(rel)

    def listdir(self, rel: str = "") -> list[str]:
        try:
            return sorted(os.listdir(self._p(rel)))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise storage_error(exc, f"cannot list {self._p(rel)}") from exc

    def exists(self, rel: str) -> bool:
        return os.path.exists(self._p(rel))

    def size(self, rel: str) -> int:
        return os.path.getsize(self._p(rel))

    def makedirs(self, rel: str) -> None:
        try:
            os.makedirs(self._p(rel), exist_ok=True)
        except OSError as exc:
            raise storage_error(exc, f"cannot create {self._p(rel)}") from exc

    def open_writer(self, rel: str) -> LocalWriter:
        return LocalWriter(self._p(rel))

    def open_reader(self, rel: str) -> LocalReader:
        return LocalReader(self._p(rel))

    def read_bytes(self, rel: str) -> bytes:
        with open(self._p(rel), "rb") as f:
            return f.read()

    def write_bytes(self, rel: str, data: bytes) -> None:
        w = self.open_writer(rel)
        w.write(data)
        w.close()

    def rename(self, src: str, dst: str) -> None:
        try:
            os.rename(self._p(src), self._p(dst))
        except OSError as exc:
            raise storage_error(exc, f"cannot commit {self._p(dst)}") from exc
        fsync_dir(os.path.dirname(self._p(dst)) or ".")

    def remove(self, rel: str) -> None:
        path = self._p(rel)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.unlink(path)


class LocalReader:
    def __init__(self, path: str) -> None:
        self._f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by close()

    def readinto(self, buffer: memoryview) -> int:
        return self._f.readinto(buffer) or 0

    def close(self) -> None:
        self._f.close()
