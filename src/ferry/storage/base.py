"""The storage extension point: where checkpoint bytes live, and how a checkpoint commits.

A backend implements ``Storage``, the core: listing, whole and streamed reads and writes,
folders, removal. Two capabilities are optional, each its own small protocol that the
code checks with ``isinstance`` where it can make use of one:

- ``AtomicRename``: renaming a folder is atomic and durable, so a checkpoint commits by
  renaming its staging folder (the ``rename`` strategy) rather than by a marker file.
- ``LocalFiles``: the files are on the local filesystem, so the writer can start the
  kernel's writeback early, folders can be fsynced, and ``torch.distributed.checkpoint``
  can write sharded state straight into a checkpoint.

A backend with only the core commits with the ``COMMITTED`` marker and works everywhere
except for sharded state. How a save calls into a backend, in order and by whom, is
written down once, in ``ferry.storage.transaction``.
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

    def child_url(self, rel: str) -> str: ...

    def listdir(self, rel: str = "") -> list[str]:
        """Entry names under ``rel``, sorted; [] when it does not exist."""
        ...

    def exists(self, rel: str) -> bool: ...

    def size(self, rel: str) -> int:
        """Bytes in a file; FileNotFoundError when it is missing."""
        ...

    def makedirs(self, rel: str) -> None: ...

    def open_writer(self, rel: str) -> Writer: ...

    def open_reader(self, rel: str) -> Reader:
        """FileNotFoundError when it is missing."""
        ...

    def read_bytes(self, rel: str) -> bytes:
        """A whole small file (a manifest). FileNotFoundError when it is missing."""
        ...

    def write_bytes(self, rel: str, data: bytes) -> None:
        """A whole small file, durable on return (a marker, a manifest)."""
        ...

    def remove(self, rel: str) -> None:
        """A file or a folder with everything in it; nothing when it is already gone."""
        ...


@runtime_checkable
class AtomicRename(Protocol):
    """Capability: folders can be renamed in one atomic, durable step."""

    atomic_rename: bool
    """False where ``rename`` exists but is not atomic (an object store's copy and delete):
    such a backend commits with the marker, as one without ``rename`` does."""

    def rename(self, src: str, dst: str) -> None: ...


@runtime_checkable
class LocalFiles(Protocol):
    """Capability: the files are on the local (or a shared, mounted) filesystem."""

    def local_path(self, rel: str) -> str:
        """The filesystem path of ``rel``."""
        ...


def can_rename(storage: Storage) -> bool:
    """Whether ``storage`` renames folders atomically."""
    return isinstance(storage, AtomicRename) and storage.atomic_rename


class CommitStrategy(Protocol):
    """How a fully written checkpoint folder becomes visible, atomically, and how a
    committed one is taken back."""

    name: str

    def staging_name(self, final: str) -> str: ...

    def commit(self, storage: Storage, staging: str, final: str) -> None: ...

    def retract(self, storage: Storage, name: str) -> str:
        """Take a committed checkpoint back in one atomic step: it is no longer listed.
        Returns the folder left to delete (hidden, or no longer committed)."""
        ...

    def is_committed(self, storage: Storage, name: str) -> bool: ...

    def is_staging(self, name: str) -> bool: ...
