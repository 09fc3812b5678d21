"""Which checkpoints exist under a root, in order, and which to keep."""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ferry.errors import NoCheckpointError
from ferry.storage import Storage, open_storage, strategy_for, sweep
from ferry.storage.atomic import MANIFEST

_NAME = re.compile(r"^step-(\d{12})(?:\.(\d+))?$")

_held: Counter[str] = Counter()
"""Checkpoint URLs this process reads now (a copy to the remote), by holder count."""
_held_lock = threading.Lock()


@contextmanager
def held(storage: Storage, name: str) -> Iterator[None]:
    """Keep checkpoint ``name`` out of this process's retention while the block reads it:
    a copy to a slow remote must not lose its source to newer saves. The next retention
    after the block removes it, if it is still beyond ``keep_last``."""
    url = storage.child_url(name)
    with _held_lock:
        _held[url] += 1
    try:
        yield
    finally:
        with _held_lock:
            _held[url] -= 1
            if not _held[url]:
                del _held[url]


def _is_held(storage: Storage, name: str) -> bool:
    with _held_lock:
        return storage.child_url(name) in _held


@dataclass(frozen=True, order=True)
class CheckpointRef:
    step: int
    seq: int
    name: str
    url: str


def list_checkpoints(storage: Storage) -> list[CheckpointRef]:
    """Committed checkpoints under a root, oldest first (by step, then by save order)."""
    strategy = strategy_for(storage)
    refs = []
    for name in storage.listdir():
        m = _NAME.match(name)
        if m and strategy.is_committed(storage, name):
            refs.append(CheckpointRef(int(m[1]), int(m[2] or 0), name, storage.child_url(name)))
    return sorted(refs)


def split_url(url: str) -> tuple[Storage, str | None]:
    """(root storage, checkpoint folder name) for a checkpoint URL, or (root, None) for a root."""
    storage = open_storage(url)
    if storage.exists(MANIFEST) and _NAME.match(url.rstrip("/").rsplit("/", 1)[-1]):
        parent_url, name = url.rstrip("/").rsplit("/", 1)
        parent = open_storage(parent_url)
        if not strategy_for(parent).is_committed(parent, name):
            raise NoCheckpointError(
                f"{url} was never committed (a save that was interrupted); "
                "load its root to get the newest committed checkpoint"
            )
        return parent, name
    return storage, None


def apply_retention(
    storage: Storage, keep_last: int, keep_every: int | None = None, *, later: bool = False
) -> list[str]:
    """Delete committed checkpoints beyond the newest ``keep_last`` (those whose step is a
    multiple of ``keep_every`` are kept), and staging folders of saves that died.
    Checkpoints ``held`` by this process (a copy in flight) are kept until it ends.
    With ``later``, a retired checkpoint is unlisted now and its bytes are deleted in the
    background (``storage.sweep``). Single writer: call only from the process that saves.
    Returns what was removed."""
    strategy = strategy_for(storage)
    refs = list_checkpoints(storage)
    doomed = [
        r.name
        for r in refs[: max(len(refs) - keep_last, 0)]
        if not (keep_every and r.step % keep_every == 0) and not _is_held(storage, r.name)
    ]
    committed = {r.name for r in refs}
    for name in storage.listdir():
        if strategy.is_staging(name) or (_NAME.match(name) and name not in committed):
            doomed.append(name)
    for name in doomed:
        if name not in committed:
            storage.remove(name)
        elif later:
            sweep.later(storage, strategy.retract(storage, name))
        else:
            storage.remove(strategy.retract(storage, name))
    return doomed
