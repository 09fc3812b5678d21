"""Persist a snapshot as one checkpoint: its data files and manifest, through the commit
transaction (``ferry.storage.transaction``), which makes it durable and then visible."""

from __future__ import annotations

import os
import platform
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ferry._version import __version__
from ferry.engine.codec import Flattened, entries_json
from ferry.errors import ConfigError
from ferry.format.wire import FORMAT_NAME, FORMAT_VERSION, manifest_bytes
from ferry.storage import Storage, Transaction


@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint."""

    url: str
    step: int
    nbytes: int
    seconds: float
    """Wall time of the whole save, from when the caller stopped for it (a safe point's
    capture and snapshot included) to its commit."""
    blocking_seconds: float
    """What the save cost the caller's thread ("training blocked"): from when it stopped
    for it until it went on (``asyncsave.Stall``); the whole save when synchronous."""

    @property
    def gbps(self) -> float:
        return self.nbytes / max(self.seconds, 1e-9) / 1e9


MAX_STEP = 10**12 - 1
"""Folder names hold the step in 12 digits; a longer one would never be listed."""


def check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise ConfigError(f"step must be an int from 0 to {MAX_STEP}, got {step!r}")


def next_name(existing: list[str], step: int) -> str:
    check_step(step)
    base = f"step-{step:012d}"
    if base not in existing:
        return base
    seq = 1
    while f"{base}.{seq}" in existing:
        seq += 1
    return f"{base}.{seq}"


def build_manifest(
    flat: Flattened, step: int, files: dict[str, Any], meta: dict[str, Any] | None, world_size: int
) -> dict[str, Any]:
    now = time.time()
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "step": step,
        "created": now,
        "created_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "ferry_version": __version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "world_size": world_size,
        "files": files,
        "tensors": entries_json(flat.entries),
        "tree": flat.tree,
        "meta": meta or {},
    }


def persist(
    storage: Storage,
    flat: Flattened,
    host: memoryview | Iterable[memoryview],
    step: int,
    *,
    meta: dict[str, Any] | None = None,
    extra_files: dict[str, bytes] | None = None,
    world_size: int = 1,
) -> str:
    """Write and commit one checkpoint; returns its folder name. Single writer per root.

    ``host`` is the data file: one buffer (a snapshot) or its consecutive segments (each
    valid until the next is taken: ``snapshot.direct_segments``). A save
    that fails removes its staging folder (a full disk stays no fuller).
    """
    check_step(step)
    with Transaction.begin(storage, next_name(storage.listdir(), step)) as txn:
        txn.add_file("data-0.bin", host)
        for name, blob in (extra_files or {}).items():
            txn.add_file(name, memoryview(blob))
        return txn.commit(lambda files: manifest_bytes(build_manifest(flat, step, files, meta, world_size)))
