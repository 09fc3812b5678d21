"""Atomic-commit strategies, named, one per kind of backend.

``rename``: data is written under a hidden staging folder, then the folder is renamed to
its final name; the rename is the commit. Used where the filesystem renames atomically.

``marker``: data is written in place, and a ``COMMITTED`` marker is written last; a folder
without the marker does not exist as far as readers are concerned. Used on object stores.
"""

from __future__ import annotations

import uuid

from ferry.errors import StorageError
from ferry.storage.base import AtomicRename, CommitStrategy, Storage, can_rename

MANIFEST = "manifest.json"
MARKER = "COMMITTED"
STAGING_PREFIX = ".staging-"


def _renamer(storage: Storage) -> AtomicRename:
    if not isinstance(storage, AtomicRename):
        raise StorageError(f"{storage.url} cannot rename folders: commit there with the marker strategy")
    return storage


class RenameCommit:
    name = "rename"

    def staging_name(self, final: str) -> str:
        return f"{STAGING_PREFIX}{final}-{uuid.uuid4().hex[:8]}"

    def commit(self, storage: Storage, staging: str, final: str) -> None:
        _renamer(storage).rename(staging, final)

    def retract(self, storage: Storage, name: str) -> str:
        # Hidden under a staging name: a crash in the middle of the deletion that follows
        # must not leave a listed, half-deleted checkpoint (the next retention sweeps it).
        hidden = self.staging_name(name)
        _renamer(storage).rename(name, hidden)
        return hidden

    def is_committed(self, storage: Storage, name: str) -> bool:
        return not self.is_staging(name) and storage.exists(f"{name}/{MANIFEST}")

    def is_staging(self, name: str) -> bool:
        return name.startswith(STAGING_PREFIX)


class MarkerCommit:
    name = "marker"

    def staging_name(self, final: str) -> str:
        return final

    def commit(self, storage: Storage, staging: str, final: str) -> None:
        storage.write_bytes(f"{final}/{MARKER}", b"committed\n")

    def retract(self, storage: Storage, name: str) -> str:
        storage.remove(f"{name}/{MARKER}")
        return name

    def is_committed(self, storage: Storage, name: str) -> bool:
        return storage.exists(f"{name}/{MARKER}")

    def is_staging(self, name: str) -> bool:
        return name.startswith(STAGING_PREFIX)


STRATEGIES: dict[str, CommitStrategy] = {"rename": RenameCommit(), "marker": MarkerCommit()}


def strategy_for(storage: Storage) -> CommitStrategy:
    """``rename`` where the backend renames atomically, otherwise a commit ``marker``."""
    return STRATEGIES["rename" if can_rename(storage) else "marker"]
