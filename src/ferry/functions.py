"""Framework-agnostic checkpoints: your own pair of functions writes and reads files.

    def save_fn(path, value): ...       # write files under the folder `path`
    def restore_fn(path): ... return value

    ckpt = ferry.FunctionCheckpoint(save_fn, restore_fn)
    value = ckpt.restore(default=initial)
    while not done:
        value = work(value)
        ckpt.step(value)                # a safe point: saves when due, stops on a signal

The files become part of a ferry checkpoint: checksummed, committed atomically, kept by
the same retention, stored on any backend.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Generic, TypeVar

from ferry.engine.catalog import split_url
from ferry.engine.ranks import rank_files_prefix
from ferry.engine.reader import read_file
from ferry.errors import CorruptCheckpointError, FerryError
from ferry.session import Session, current

T = TypeVar("T")
PREFIX = "user/"


class FunctionCheckpoint(Generic[T]):
    def __init__(
        self,
        save_fn: Callable[[str, T], None],
        restore_fn: Callable[[str], T],
        session: Session | None = None,
    ) -> None:
        self.save_fn, self.restore_fn = save_fn, restore_fn
        found = session or current()
        if found is None:
            raise FerryError(
                "FunctionCheckpoint found no ferry session: pass session=, or call ferry.configure(...) first"
            )
        self.session = found
        self.session.extra_files = self._files
        self._value: T | None = None

    def restore(self, default: T) -> T:
        """The value from the newest checkpoint, or ``default`` when starting fresh."""
        self.session.restore()
        loaded = self.session.loaded
        if loaded is None:
            return default
        storage, name = split_url(loaded.url)
        if name is None:
            raise CorruptCheckpointError(f"{loaded.url} is not a checkpoint folder of its root")
        prefix = rank_files_prefix(self.session.checkpointer.rank) + PREFIX
        with tempfile.TemporaryDirectory(prefix="ferry-restore-") as tmp:
            for file, meta in loaded.manifest["files"].items():
                if not file.startswith(prefix):
                    continue
                rel = file[len(prefix) :]
                dest = os.path.normpath(os.path.join(tmp, rel))
                if os.path.isabs(rel) or not dest.startswith(tmp + os.sep):
                    raise CorruptCheckpointError(f"{loaded.url}: file name {file!r} leads outside it")
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with open(dest, "wb") as f:
                    f.write(read_file(storage, name, file, meta).numpy().tobytes())
            self._value = self.restore_fn(tmp)
        return self._value

    def step(self, value: T) -> None:
        """Record ``value`` as the state after this iteration; a safe point."""
        self._value = value
        self.session.step()

    @property
    def global_step(self) -> int:
        return self.session.global_step

    def _files(self) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        with tempfile.TemporaryDirectory(prefix="ferry-save-") as tmp:
            self.save_fn(tmp, self._value)  # type: ignore[arg-type]
            for root, _dirs, names in os.walk(tmp):
                for n in names:
                    path = os.path.join(root, n)
                    rel = os.path.relpath(path, tmp).replace(os.sep, "/")
                    with open(path, "rb") as f:
                        files[PREFIX + rel] = f.read()
        return files
