"""The commit transaction: the one sequence that writes a checkpoint folder and makes it
visible. Every writer goes through it (a save, a multi-rank save, a copy to or from a
remote, a bundle); none repeats its steps.

Call order, in the spirit of orbax's temporary path + finalize and of DCP's "metadata last":

1. ``Transaction.begin(storage, final)``: the single writer (rank 0 of a multi-rank job)
   picks the staging folder through the backend's commit strategy (``storage.atomic``) and
   creates it. Nobody lists a staging folder as a checkpoint.
2. Files, each durable before the call returns, each recorded with its size and xxh3-64:
   ``add_file(rel, data)`` writes bytes; ``add_copy(src, src_rel, rel, expect)`` streams a
   file from another root; ``add_written(rel, size, digest)`` records a file another party
   wrote into the folder (another rank, ``torch.distributed.checkpoint``). In a multi-rank
   job, rank R >= 1 calls ``Transaction.join(storage, final, staging)`` with the names rank 0
   broadcast, adds its own files, and sends its ``files`` to rank 0, which records each
   with ``add_written``. A rank only ever writes files of its own.
3. ``commit(manifest)``: the writer only, once every file is recorded. Writes the manifest
   (bytes, or a function of the files table returning them), makes the entries of every
   folder written to durable (fsync, on local files), then commits through the strategy
   (a rename, or the ``COMMITTED`` marker). Returns the final name.
4. ``abort()``: the writer only, on any failure before ``commit`` returned: removes the
   staging folder, so a failed save leaves nothing behind (a full disk stays no fuller).
   As a context manager the transaction aborts when its block raises; a process that dies
   instead leaves an invisible staging folder, which retention sweeps.

A commit that raised counts as failed: abort removes whatever is left under the staging
name (a marker that may have landed included). A rename that went through and then could
not sync its parent folder leaves the checkpoint committed while the save reports a
failure: nothing is lost either way. Steps may be retried (a copy over a flaky network): a file added
again replaces its record, and ``commit`` may be called again after it raised.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ferry.errors import StorageError
from ferry.storage.atomic import MANIFEST, strategy_for
from ferry.storage.base import CommitStrategy, LocalFiles, Storage
from ferry.storage.hashed import Data, read_chunks, write_hashed
from ferry.storage.local import fsync_dir
from ferry.storage.sweep import swept

Manifest = bytes | Callable[[dict[str, dict[str, Any]]], bytes]
"""The manifest's bytes, or a function of the files table (``{rel: {"size", "xxh3_64"}}``)
that returns them."""


@dataclass(frozen=True)
class FileRecord:
    size: int
    xxh3_64: str

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "xxh3_64": self.xxh3_64}


class Transaction:
    """One checkpoint folder being written; see the module's docstring for the call order."""

    def __init__(self, storage: Storage, final: str, staging: str, *, writer: bool) -> None:
        self.storage = storage
        self.final = final
        self.staging = staging
        self.writer = writer
        """True for the one party that commits or aborts; False for a rank that joined."""
        self.strategy: CommitStrategy = strategy_for(storage)
        self.records: dict[str, FileRecord] = {}
        self._state = "open"

    # ---------------------------------------------------------------- begin / join
    @classmethod
    def begin(cls, storage: Storage, final: str) -> Transaction:
        """Create the staging folder of the checkpoint that will be named ``final``, once
        the checkpoints retired before it are deleted (``storage.sweep``)."""
        swept()
        staging = strategy_for(storage).staging_name(final)
        storage.makedirs(staging)
        return cls(storage, final, staging, writer=True)

    @classmethod
    def join(cls, storage: Storage, final: str, staging: str) -> Transaction:
        """Another rank's side of a transaction the writer began: it adds files, no more."""
        return cls(storage, final, staging, writer=False)

    # ---------------------------------------------------------------- files
    def path(self, rel: str) -> str:
        """Where ``rel`` of the checkpoint is while it is being written, under the root."""
        return f"{self.staging}/{rel}"

    def local_path(self, rel: str) -> str | None:
        """The filesystem path of ``rel``, for a party that writes it itself (DCP); None
        where the backend has no local files (``LocalFiles``)."""
        if not isinstance(self.storage, LocalFiles):
            return None
        return self.storage.local_path(self.path(rel))

    def add_file(self, rel: str, data: Data) -> FileRecord:
        """Write ``data`` durably as ``rel`` and record it."""
        self._check_open()
        _make_parent(self.storage, self.staging, rel)
        size, digest = write_hashed(self.storage, self.path(rel), data)
        self.records[rel] = record = FileRecord(size, digest)
        return record

    def add_copy(
        self,
        src: Storage,
        src_rel: str,
        rel: str,
        expect: FileRecord | None = None,
        *,
        counted: Callable[[int], None] | None = None,
    ) -> FileRecord:
        """Stream ``src_rel`` of root ``src`` into ``rel``, durably, and record it. With
        ``expect``, a file of another size or checksum fails before it is made durable;
        ``counted(n)`` is told of every ``n`` bytes read (a progress display)."""
        self._check_open()
        _make_parent(self.storage, self.staging, rel)
        want = None if expect is None else (expect.size, expect.xxh3_64)
        pieces = read_chunks(src, src_rel)
        if counted is not None:
            pieces = _counting(pieces, counted)
        size, digest = write_hashed(self.storage, self.path(rel), pieces, want)
        self.records[rel] = record = FileRecord(size, digest)
        return record

    def add_written(self, rel: str, size: int, digest: str) -> FileRecord:
        """Record a file that another party wrote, durably, into the staging folder."""
        self._check_open()
        self.records[rel] = record = FileRecord(size, digest)
        return record

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        """The files table, as the manifest holds it."""
        return {rel: r.to_json() for rel, r in self.records.items()}

    def missing(self) -> list[str]:
        """Recorded files that are not (or no longer) whole in the staging folder: a remote
        that restarted during a copy may have lost some. A remote that cannot be asked
        (down) raises: that is no answer, not an absence."""
        return [rel for rel, r in self.records.items() if not _whole(self.storage, self.path(rel), r.size)]

    # ---------------------------------------------------------------- commit / abort
    def commit(self, manifest: Manifest) -> str:
        """Write the manifest, make the folder durable, commit. Returns the final name."""
        self._check_open()
        if not self.writer:
            raise StorageError("only the rank that began a checkpoint commits it (rank 0)")
        body = manifest(self.files) if callable(manifest) else manifest
        self.storage.write_bytes(self.path(MANIFEST), body)
        _sync_folders(self.storage, [self.path(rel) for rel in (*self.records, MANIFEST)])
        self.strategy.commit(self.storage, self.staging, self.final)
        self._state = "committed"
        return self.final

    def abort(self) -> None:
        """Remove the staging folder (the writer only; a joined rank leaves it to the writer)."""
        if self._state != "open" or not self.writer:
            return
        self._state = "aborted"
        with contextlib.suppress(Exception):  # the original failure is the one to report
            self.storage.remove(self.staging)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            self.abort()

    # ---------------------------------------------------------------- internals
    def _check_open(self) -> None:
        if self._state != "open":
            raise StorageError(f"the transaction of {self.final} is {self._state}; begin a new one")


def _make_parent(storage: Storage, staging: str, rel: str) -> None:
    """Create the folder of the checkpoint's file ``rel`` below the staging folder."""
    if "/" in rel:
        storage.makedirs(f"{staging}/{rel.rsplit('/', 1)[0]}")


def _whole(storage: Storage, path: str, size: int) -> bool:
    try:
        return storage.size(path) == size
    except FileNotFoundError:
        return False


def _sync_folders(storage: Storage, paths: list[str]) -> None:
    """fsync each folder that got a new entry (one of ``paths``): the files' bytes are durable
    already, their names are not until their folder is. Object stores have no folders to sync."""
    if not isinstance(storage, LocalFiles):
        return
    folders = {os.path.dirname(path) for path in paths}
    for folder in sorted(folders, key=len, reverse=True):  # deepest first, the staging last
        fsync_dir(storage.local_path(folder))


def _counting(pieces: Iterator[memoryview], counted: Callable[[int], None]) -> Iterator[memoryview]:
    for piece in pieces:
        counted(len(piece))
        yield piece
