"""Persist a snapshot: data first (durable), then the manifest, then the atomic commit."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from ferry._version import __version__
from ferry.engine.format import FORMAT_NAME, FORMAT_VERSION, Flattened, manifest_bytes
from ferry.engine.pools import submit
from ferry.errors import ConfigError, StorageError
from ferry.storage import Storage, strategy_for
from ferry.storage.atomic import MANIFEST

CHUNK = 16 << 20
"""Bytes per write call: large enough for full-speed I/O, small enough to overlap hashing."""
SMALL = 1 << 20
"""Segments below this are gathered into one chunk instead of one write call each."""
BOUNCE = 4 << 20


@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint."""

    url: str
    step: int
    nbytes: int
    seconds: float
    """Wall time of the whole save, snapshot included."""
    blocking_seconds: float
    """How long the caller was blocked (the snapshot; the whole save when synchronous)."""

    @property
    def gbps(self) -> float:
        return self.nbytes / max(self.seconds, 1e-9) / 1e9


_hash_pool = ThreadPoolExecutor(1, thread_name_prefix="ferry-hash")


def chunks(data: memoryview | Sequence[memoryview]) -> Iterator[memoryview]:
    """The bytes of ``data`` (one view or consecutive segments) in chunks of <= CHUNK.

    Big segments are cut without a copy; runs of small ones (many tiny tensors, padding)
    are gathered into one bounce buffer, so a checkpoint of 10,000 biases is not 10,000
    syscalls. A yielded chunk is valid until the next one is requested.
    """
    segments = [data] if isinstance(data, memoryview) else data
    fill = 0
    out = memoryview(b"")
    for seg in segments:
        seg = seg.cast("B") if seg.format != "B" or seg.ndim != 1 else seg
        if len(seg) < SMALL:
            if not out:
                out = memoryview(bytearray(BOUNCE))
            if fill + len(seg) > len(out):
                yield out[:fill]
                fill = 0
            out[fill : fill + len(seg)] = seg
            fill += len(seg)
            continue
        if fill:
            yield out[:fill]
            fill = 0
        for start in range(0, len(seg), CHUNK):
            yield seg[start : start + CHUNK]
    if fill:
        yield out[:fill]


class _Writeback:
    """Starts the kernel's writeback of a local file's written bytes while the rest is
    still being written, so the closing fsync waits only for the tail instead of the whole
    file (a plain ``write`` + ``fsync`` leaves the disk idle until the fsync). On Linux,
    ``POSIX_FADV_DONTNEED`` starts writeback of the dirty pages of a range and drops the
    clean ones: each call covers the new bytes and the previous range again, whose pages
    are clean by then, so a checkpoint does not push the job's own data out of the page
    cache either. Advice only: durability still comes from the writer's fsync."""

    def __init__(self, path: str | None) -> None:
        self._fd: int | None = None
        self._lag = self._done = 0
        if path is not None and hasattr(os, "posix_fadvise"):
            with contextlib.suppress(OSError):
                self._fd = os.open(path, os.O_RDONLY)

    def kick(self, upto: int) -> None:
        if self._fd is not None and upto > self._done:
            with contextlib.suppress(OSError):
                os.posix_fadvise(self._fd, self._lag, upto - self._lag, os.POSIX_FADV_DONTNEED)
            self._lag, self._done = self._done, upto

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def write_hashed(storage: Storage, rel: str, data: memoryview | Sequence[memoryview]) -> str:
    """Write ``data`` durably to ``rel``; returns its xxh3-64 hex digest.

    Hashing a chunk runs on another thread while the same chunk is written (xxhash and
    os.write both release the GIL), so the checksum costs almost no wall time.
    """
    hasher = xxhash.xxh3_64()
    writer = storage.open_writer(rel)
    writeback = _Writeback(storage.local_path(rel))
    written = 0
    try:
        for chunk in chunks(data):
            fut = submit(_hash_pool, hasher.update, chunk)
            try:
                writer.write(chunk)
            finally:
                fut.result()  # the chunk (maybe the bounce buffer) is reused next
            written += len(chunk)
            writeback.kick(written)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        writeback.close()
    return hasher.hexdigest()


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
        "tensors": [e.to_json() for e in flat.entries],
        "tree": flat.tree,
        "meta": meta or {},
    }


def _fsync_dir(storage: Storage, rel: str) -> None:
    """Make a local folder's entries durable (the files' names, not only their bytes)."""
    path = storage.local_path(rel)
    if path is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise StorageError(f"cannot flush {path}: {exc.strerror or exc}") from exc


def persist(
    storage: Storage,
    flat: Flattened,
    host: memoryview | Sequence[memoryview],
    step: int,
    *,
    meta: dict[str, Any] | None = None,
    extra_files: dict[str, bytes] | None = None,
    world_size: int = 1,
) -> str:
    """Write and commit one checkpoint; returns its folder name. Single writer per root.

    ``host`` is the data file: one buffer (a snapshot) or its consecutive segments. A save
    that fails before the commit removes its staging folder (a full disk stays no fuller).
    """
    check_step(step)
    strategy = strategy_for(storage)
    storage.makedirs("")
    final = next_name(storage.listdir(), step)
    staging = strategy.staging_name(final)
    storage.makedirs(staging)
    try:
        size = len(host) if isinstance(host, memoryview) else sum(len(s) for s in host)
        files: dict[str, Any] = {}
        digest = write_hashed(storage, f"{staging}/data-0.bin", host)
        files["data-0.bin"] = {"size": size, "xxh3_64": digest}
        for name, blob in (extra_files or {}).items():
            if "/" in name:
                storage.makedirs(f"{staging}/{name.rsplit('/', 1)[0]}")
            digest = write_hashed(storage, f"{staging}/{name}", memoryview(blob))
            files[name] = {"size": len(blob), "xxh3_64": digest}
        body = build_manifest(flat, step, files, meta, world_size)
        storage.write_bytes(f"{staging}/{MANIFEST}", manifest_bytes(body))
        _fsync_dir(storage, staging)
    except BaseException:
        with contextlib.suppress(Exception):
            storage.remove(staging)
        raise
    strategy.commit(storage, staging, final)
    return final
