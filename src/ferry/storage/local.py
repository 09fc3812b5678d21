"""Local filesystem backend: direct os calls, fsync for durability, atomic rename.

Implements the core ``Storage`` and both capabilities, ``AtomicRename`` and ``LocalFiles``.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat

from ferry.errors import StorageError, UnsafeCheckpointError


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

    The one place the checkpoint engine does this: after a rename, and before a commit for
    each folder that a checkpoint's files were written to. The job's own JSON files do it in
    ``runtime/atomicjson.py``, which does not import storage (fsspec) to stay fast."""
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
        fd = self._open_inside(rel)
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def makedirs(self, rel: str) -> None:
        try:
            os.makedirs(self._p(rel), exist_ok=True)
        except OSError as exc:
            raise storage_error(exc, f"cannot create {self._p(rel)}") from exc

    def open_writer(self, rel: str) -> LocalWriter:
        return LocalWriter(self._p(rel))

    def open_reader(self, rel: str) -> LocalReader:
        return LocalReader(self._open_inside(rel))

    def read_bytes(self, rel: str) -> bytes:
        with open(self._open_inside(rel), "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            data = bytearray(size)
            got = 0
            while got < size and (n := f.readinto(memoryview(data)[got:])):
                got += n
            return bytes(data[:got])

    def _open_inside(self, rel: str) -> int:
        """A read-only descriptor of the regular file ``rel``, reached from the root without
        following a symbolic link at any step below it (the root itself is the user's
        choice and may be one): a checkpoint may come from anywhere, and a link in it could
        point at any file of this machine. A FIFO, device or socket is refused before it is
        opened (opening one can block or have effects); the type is checked again on the
        open descriptor, so a swap in between is caught too. FileNotFoundError when absent."""
        parts = [p for p in rel.split("/") if p]
        if not parts or any(p in (".", "..") or "\0" in p for p in parts):
            raise UnsafeCheckpointError(f"{self._p(rel)}: not a path inside {self.root}; refused")
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY)
        except NotADirectoryError as exc:
            raise FileNotFoundError(self._p(rel)) from exc
        try:
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                mode = os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode
                if not (stat.S_ISREG(mode) if last else stat.S_ISDIR(mode)):
                    raise _refused(self._p("/".join(parts[: i + 1])), mode, last)
                child = os.open(part, flags | (os.O_NONBLOCK if last else os.O_DIRECTORY), dir_fd=fd)
                os.close(fd)
                fd = child
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise _refused(self._p(rel), mode, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

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


def _refused(path: str, mode: int, want_file: bool) -> UnsafeCheckpointError:
    if stat.S_ISLNK(mode):
        what = "a symbolic link"
    elif stat.S_ISDIR(mode):
        what = "a folder"
    elif stat.S_ISREG(mode):
        what = "a file"
    else:
        what = "a special file (FIFO, device or socket)"
    want = "regular files" if want_file else "real folders"
    return UnsafeCheckpointError(
        f"{path} is {what}; ferry reads only {want} inside a checkpoint root and never follows "
        "links out of it: replace it with the real file, or load another checkpoint"
    )


class LocalReader:
    def __init__(self, fd: int) -> None:
        self._f = open(fd, "rb", buffering=0)  # noqa: SIM115 - closed by close()

    def readinto(self, buffer: memoryview) -> int:
        return self._f.readinto(buffer) or 0

    def close(self) -> None:
        self._f.close()
