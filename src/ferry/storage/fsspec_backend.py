"""Any fsspec filesystem (s3://, memory://, root://, gcs://, ...) as a checkpoint root.

Backends differ in small ways; the per-protocol quirks live in the ``QUIRKS`` table rather
than in branches scattered over the code. Where a gap is the same for every backend (one
filesystem names a missing path ``FileNotFoundError``, another a plain ``OSError`` with the
server's words), it is handled once, for all of them.

Whole-file reads and writes go through ``open`` rather than ``cat_file``/``pipe_file``:
every fsspec filesystem implements ``open``, while those two are optional (fsspec-xrootd
0.5 lacks ``pipe_file`` and its ``cat_file`` needs arguments that fsspec calls without),
and one path for bytes keeps the bytes-only and durable-close quirks in one place.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ferry.errors import StorageError
from ferry.storage.extras import install_hint

log = logging.getLogger("ferry")


def _xrootd_sync(f: Any) -> None:
    """Ask the XRootD server to fsync the file (kXR_sync) before it is closed.

    fsspec-xrootd's ``close`` does not, and without it "closed" means "in the server's page
    cache": a server crash could lose data behind an already committed manifest. The
    ``XRootD.client.File`` handle is not public in fsspec-xrootd; if a later version renames
    it, saving goes on with a warning rather than failing every checkpoint.
    """
    handle = getattr(f, "_myFile", None)
    if handle is None:
        log.warning(
            "ferry: this fsspec-xrootd has no file handle to sync; root:// writes are "
            "not fsynced before the commit"
        )
        return
    status, _ = handle.sync(timeout=getattr(f, "timeout", 0))
    if not status.ok:
        raise OSError(f"sync failed: {status.message.strip()}")


@dataclass(frozen=True)
class Quirks:
    """What one protocol needs beyond plain fsspec calls. Add a row to ``QUIRKS``, not an ``if``."""

    bytes_only_writes: bool = False
    """The backend's file objects reject memoryview and need real ``bytes``."""
    atomic_rename: bool = False
    """``fs.mv`` of a folder is atomic on the server, so the ``rename`` commit can be used."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Filesystem options given before the user's (the user's win)."""
    before_close: Callable[[Any], None] | None = None
    """Called with a written file object before ``close``, to make its bytes durable."""


QUIRKS: dict[str, Quirks] = {
    "root": Quirks(
        # pyxrootd's File.write takes bytes only: "argument 1 must be read-only bytes-like
        # object, not memoryview".
        bytes_only_writes=True,
        # XRootD's mv is the server's rename(2) on its POSIX export (XrdOssSys::Rename): a
        # folder appears under its final name whole or not at all. This assumes a POSIX
        # export or a namespace that renames in place (EOS, dCache); a federation whose
        # redirector spreads one folder over several servers is not such a place.
        atomic_rename=True,
        # fsspec-xrootd's listing cache is never told about renames and deletes by other
        # processes (and not even about all of its own), and answers stale stats from it.
        options={"use_listings_cache": False},
        before_close=_xrootd_sync,
    ),
}

_WRITE_CHUNK = 32 << 20


class FsspecWriter:
    def __init__(self, fs: Any, path: str, quirks: Quirks) -> None:
        self.path = path
        self._quirks = quirks
        try:
            self._f: Any = fs.open(path, "wb")
        except Exception as exc:
            raise StorageError(f"cannot create {path}: {exc}") from exc

    def write(self, data: memoryview | bytes) -> None:
        view = memoryview(data).cast("B")
        try:
            for start in range(0, len(view), _WRITE_CHUNK):
                chunk = view[start : start + _WRITE_CHUNK]
                self._f.write(bytes(chunk) if self._quirks.bytes_only_writes else chunk)
        except Exception as exc:
            self.abort()
            raise StorageError(f"cannot write {self.path}: {exc}") from exc

    def close(self) -> None:
        try:
            if self._quirks.before_close is not None:
                self._quirks.before_close(self._f)
            self._f.close()
        except Exception as exc:
            raise StorageError(f"cannot finish {self.path}: {exc}") from exc

    def abort(self) -> None:
        try:
            if hasattr(self._f, "discard"):
                self._f.discard()
            else:
                self._f.close()
        except Exception:
            pass  # the write already failed; the staging folder is never committed


class FsspecReader:
    def __init__(self, fs: Any, path: str) -> None:
        self.path = path
        self._f: Any = fs.open(path, "rb")

    def readinto(self, buffer: memoryview) -> int:
        if hasattr(self._f, "readinto"):
            try:
                return int(self._f.readinto(buffer))
            except (NotImplementedError, AttributeError, TypeError):
                pass
            except Exception as exc:  # the server or client failed: not the checkpoint's fault
                raise StorageError(f"cannot read {self.path}: {exc}") from exc
        try:
            data = self._f.read(len(buffer))
        except Exception as exc:
            raise StorageError(f"cannot read {self.path}: {exc}") from exc
        if len(data) > len(buffer):  # a server that sends more than was asked for
            raise StorageError(f"cannot read {self.path}: the backend returned more bytes than asked")
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._f.close()


class FsspecStorage:
    """The core ``Storage``, and ``AtomicRename`` where the protocol's quirks say so."""

    def __init__(self, url: str, **options: Any) -> None:
        import fsspec

        self.url = url.rstrip("/")
        self.protocol = url.split("://", 1)[0]
        self.quirks = QUIRKS.get(self.protocol, Quirks())
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url, **{**self.quirks.options, **options})
        except (ImportError, ValueError) as exc:
            raise StorageError(
                f"no fsspec backend for {self.protocol}:// ({exc}); install it: {install_hint(self.protocol)}"
            ) from exc
        self.root = self.root.rstrip("/")
        self.atomic_rename = self.quirks.atomic_rename

    def _p(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def child_url(self, rel: str) -> str:
        return f"{self.url}/{rel}" if rel else self.url

    def _missing(self, path: str) -> bool:
        """Whether ``path`` is absent; asked after a call failed, to name the failure right."""
        try:
            return not self.fs.exists(path)
        except Exception:
            return False  # the server is unreachable: report the original error

    def _call(
        self, what: str, rel: str, fn: Callable[..., Any], *args: Any, missing: bool = True, **kwargs: Any
    ) -> Any:
        """``fn(path of rel, *args)``. With ``missing``, a missing path raises FileNotFoundError
        on every backend (the engine relies on it; fsspec-xrootd says OSError); any other
        failure, and every failure without ``missing``, raises StorageError."""
        path = self._p(rel)
        try:
            return fn(path, *args, **kwargs)
        except Exception as exc:
            if missing and isinstance(exc, FileNotFoundError):
                raise
            if missing and self._missing(path):
                raise FileNotFoundError(path) from exc
            raise StorageError(f"cannot {what} {self.child_url(rel)}: {exc}") from exc

    def listdir(self, rel: str = "") -> list[str]:
        self.fs.invalidate_cache()
        try:
            entries = self._call("list", rel, self.fs.ls, detail=False)
        except FileNotFoundError:
            return []
        return sorted({str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries})

    def exists(self, rel: str) -> bool:
        # missing=False: a failed call is an error, never "absent" (the server may be down).
        return bool(self._call("stat", rel, self.fs.exists, missing=False))

    def size(self, rel: str) -> int:
        return int(self._call("stat", rel, self.fs.size))

    def makedirs(self, rel: str) -> None:
        self._call("create", rel, self.fs.makedirs, exist_ok=True, missing=False)

    def open_writer(self, rel: str) -> FsspecWriter:
        return FsspecWriter(self.fs, self._p(rel), self.quirks)

    def open_reader(self, rel: str) -> FsspecReader:
        reader: FsspecReader = self._call("open", rel, lambda path: FsspecReader(self.fs, path))
        return reader

    def read_bytes(self, rel: str) -> bytes:
        def read(path: str) -> bytes:
            with self.fs.open(path, "rb") as f:
                return bytes(f.read())

        return bytes(self._call("read", rel, read))

    def write_bytes(self, rel: str, data: bytes) -> None:
        writer = self.open_writer(rel)
        writer.write(data)
        writer.close()

    def rename(self, src: str, dst: str) -> None:
        # Paths, not URLs: fsspec-xrootd hands mv's arguments to the server as they are, and
        # the server refuses "root://..." ("Renaming relative path ... is disallowed").
        self._call("rename", src, self.fs.mv, self._p(dst), recursive=True, missing=False)

    def remove(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):  # already gone is what was asked
            self._call("remove", rel, self.fs.rm, recursive=True)
