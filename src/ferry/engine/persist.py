"""Persist a snapshot: data first (durable), then the manifest, then the atomic commit."""

from __future__ import annotations

import os
import platform
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from ferry._version import __version__
from ferry.engine.format import FORMAT_NAME, FORMAT_VERSION, Flattened, manifest_bytes
from ferry.storage import Storage, strategy_for
from ferry.storage.atomic import MANIFEST

CHUNK = 16 << 20


@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint."""

    url: str
    step: int
    nbytes: int
    seconds: float
    """Wall time of the whole save, snapshot included."""
    blocking_seconds: float
    """How long the caller was blocked (the snapshot)."""

    @property
    def gbps(self) -> float:
        return self.nbytes / max(self.seconds, 1e-9) / 1e9


_hash_pool = ThreadPoolExecutor(1, thread_name_prefix="ferry-hash")


def write_hashed(storage: Storage, rel: str, data: memoryview) -> str:
    """Write ``data`` durably to ``rel``; returns its xxh3-64 hex digest.

    Hashing a chunk runs on another thread while the previous chunk is written (xxhash
    and os.write both release the GIL), so the checksum costs almost no wall time.
    """
    hasher = xxhash.xxh3_64()
    writer = storage.open_writer(rel)
    try:
        for start in range(0, len(data), CHUNK):
            chunk = data[start : start + CHUNK]
            fut = _hash_pool.submit(hasher.update, chunk)
            writer.write(chunk)
            fut.result()
    except BaseException:
        writer.abort()
        raise
    writer.close()
    return hasher.hexdigest()


def next_name(existing: list[str], step: int) -> str:
    base = f"step-{step:012d}"
    if base not in existing:
        return base
    seq = 1
    while f"{base}.{seq}" in existing:
        seq += 1
    return f"{base}.{seq}"


def build_manifest(flat: Flattened, step: int, files: dict[str, Any],
                   meta: dict[str, Any] | None, world_size: int) -> dict[str, Any]:  # fmt: skip
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
        "tensors": [e.to_json() for e in flat.entries],
        "tree": flat.tree,
        "meta": meta or {},
    }


def persist(storage: Storage, flat: Flattened, host: memoryview, step: int, *,
            meta: dict[str, Any] | None = None, extra_files: dict[str, bytes] | None = None,
            world_size: int = 1) -> str:  # fmt: skip
    """Write and commit one checkpoint; returns its folder name. Single writer per root."""
    strategy = strategy_for(storage)
    storage.makedirs("")
    final = next_name(storage.listdir(), step)
    staging = strategy.staging_name(final)
    storage.makedirs(staging)
    files: dict[str, Any] = {}
    digest = write_hashed(storage, f"{staging}/data-0.bin", host)
    files["data-0.bin"] = {"size": len(host), "xxh3_64": digest}
    for name, blob in (extra_files or {}).items():
        if "/" in name:
            storage.makedirs(f"{staging}/{name.rsplit('/', 1)[0]}")
        files[name] = {"size": len(blob),
                       "xxh3_64": write_hashed(storage, f"{staging}/{name}", memoryview(blob))}  # fmt: skip
    body = build_manifest(flat, step, files, meta, world_size)
    storage.write_bytes(f"{staging}/{MANIFEST}", manifest_bytes(body))
    strategy.commit(storage, staging, final)
    return final
