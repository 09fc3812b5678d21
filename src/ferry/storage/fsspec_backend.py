"""Any fsspec filesystem (s3://, memory://, root://, gcs://, ...) as a checkpoint root.

Backends differ in small ways; the per-protocol quirks live in ``Quirks`` rather than in
branches scattered over the code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ferry.errors import StorageError


@dataclass(frozen=True)
class Quirks:
    bytes_only_writes: bool = False
    """The backend's file objects reject memoryview and need real ``bytes``."""
    atomic_rename: bool = False
    """Renaming a folder is atomic on the server (XRootD over a POSIX export)."""


QUIRKS: dict[str, Quirks] = {
    "root": Quirks(bytes_only_writes=True, atomic_rename=False),
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
        self._f: Any = fs.open(path, "rb")

    def readinto(self, buffer: memoryview) -> int:
        if hasattr(self._f, "readinto"):
            try:
                return int(self._f.readinto(buffer))
            except (NotImplementedError, AttributeError, TypeError):
                pass
        data = self._f.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._f.close()


class FsspecStorage:
    def __init__(self, url: str, **options: Any) -> None:
        import fsspec

        self.url = url.rstrip("/")
        self.protocol = url.split("://", 1)[0]
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url, **options)
        except (ImportError, ValueError) as exc:
            raise StorageError(
                f"no fsspec backend for {self.protocol}:// ({exc}); "
                f"install it, e.g. pip install 'gpuferry[{_EXTRA.get(self.protocol, 's3')}]'"
            ) from exc
        self.root = self.root.rstrip("/")
        self.quirks = QUIRKS.get(self.protocol, Quirks())
        self.atomic_rename = self.quirks.atomic_rename

    def _p(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def child_url(self, rel: str) -> str:
        return f"{self.url}/{rel}" if rel else self.url

    def local_path(self, rel: str) -> str | None:
        return None

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise StorageError(f"{what} failed on {self.url}: {exc}") from exc

    def listdir(self, rel: str = "") -> list[str]:
        self.fs.invalidate_cache()
        try:
            entries = self._call("listing", self.fs.ls, self._p(rel), detail=False)
        except FileNotFoundError:
            return []
        return sorted({str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries})

    def exists(self, rel: str) -> bool:
        return bool(self._call("stat", self.fs.exists, self._p(rel)))

    def size(self, rel: str) -> int:
        return int(self._call("stat", self.fs.size, self._p(rel)))

    def makedirs(self, rel: str) -> None:
        self._call("mkdir", self.fs.makedirs, self._p(rel), exist_ok=True)

    def open_writer(self, rel: str) -> FsspecWriter:
        return FsspecWriter(self.fs, self._p(rel), self.quirks)

    def open_reader(self, rel: str) -> FsspecReader:
        try:
            return FsspecReader(self.fs, self._p(rel))
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise StorageError(f"cannot open {self.child_url(rel)}: {exc}") from exc

    def read_bytes(self, rel: str) -> bytes:
        return bytes(self._call("read", self.fs.cat_file, self._p(rel)))

    def write_bytes(self, rel: str, data: bytes) -> None:
        self._call("write", self.fs.pipe_file, self._p(rel), bytes(data))

    def rename(self, src: str, dst: str) -> None:
        self._call("rename", self.fs.mv, self._p(src), self._p(dst), recursive=True)

    def remove(self, rel: str) -> None:
        try:
            self.fs.rm(self._p(rel), recursive=True)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise StorageError(f"cannot remove {self.child_url(rel)}: {exc}") from exc


_EXTRA = {"s3": "s3", "root": "xrootd"}
