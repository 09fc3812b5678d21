"""The storage extension point: where checkpoint bytes live, and how a checkpoint commits.

A checkpoint *root* holds one folder per checkpoint. A save goes through these calls, in
order, all made by the single writer (rank 0 for the manifest and the commit; every rank
for its own data files):

1. ``strategy.staging_name(final)``: the folder the data is written to.
2. ``storage.makedirs(staging)``.
3. ``storage.open_writer(staging/file)`` for each data file; ``Writer.close()`` makes the
   bytes durable (fsync on a filesystem, a completed upload on an object store).
4. ``storage.write_bytes(staging/manifest.json, ...)``, durable as well.
5. ``strategy.commit(storage, staging, final)``: the checkpoint becomes visible.

Readers only ever list checkpoints through ``strategy.is_committed``, so an interrupted save
at any of these steps is invisible.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Writer(Protocol):
    """A file being written. ``close`` makes it durable; ``abort`` discards it."""

    def write(self, data: memoryview | bytes) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


@runtime_checkable
class Reader(Protocol):
    """A file being read sequentially."""

    def readinto(self, buffer: memoryview) -> int: ...

    def close(self) -> None: ...


@runtime_checkable
class Storage(Protocol):
    """A checkpoint root. Paths are relative to the root, '/'-separated."""

    url: str
    """The root, as the user gave it (a local path or an fsspec URL)."""

    atomic_rename: bool
    """True when renaming a folder is atomic and durable on this backend."""

    def child_url(self, rel: str) -> str: ...

    def listdir(self, rel: str = "") -> list[str]: ...

    def exists(self, rel: str) -> bool: ...

    def size(self, rel: str) -> int: ...

    def makedirs(self, rel: str) -> None: ...

    def open_writer(self, rel: str) -> Writer: ...

    def open_reader(self, rel: str) -> Reader: ...

    def read_bytes(self, rel: str) -> bytes: ...

    def write_bytes(self, rel: str, data: bytes) -> None: ...

    def rename(self, src: str, dst: str) -> None: ...

    def remove(self, rel: str) -> None: ...

    def local_path(self, rel: str) -> str | None:
        """The path on the local filesystem, or None for remote backends."""
        ...


class CommitStrategy(Protocol):
    """How a fully written checkpoint folder becomes visible, atomically."""

    name: str

    def staging_name(self, final: str) -> str: ...

    def commit(self, storage: Storage, staging: str, final: str) -> None: ...

    def is_committed(self, storage: Storage, name: str) -> bool: ...

    def is_staging(self, name: str) -> bool: ...
