"""Check a checkpoint without loading it: its manifest, then each file's size and checksum.

Torch-free (manifest.py, wire.py, xxhash and the storage layer only), so ``ferry verify``
and ``ferry inspect`` start fast; reader.py loads through the same ``stream_file``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import xxhash

from ferry.engine.manifest import FileEntry, Manifest, decode_manifest
from ferry.errors import CorruptCheckpointError, StorageError
from ferry.knobs import READ_CHUNK_BYTES
from ferry.storage import Storage
from ferry.storage.atomic import MANIFEST
from ferry.storage.pools import submit

CHUNK = READ_CHUNK_BYTES
_hash_pool = ThreadPoolExecutor(1, thread_name_prefix="ferry-verify")


def read_manifest(storage: Storage, name: str) -> Manifest:
    """The manifest of checkpoint ``name``, checked whole (engine/manifest.py) before any
    of its data is read."""
    where = storage.child_url(name)
    try:
        data = storage.read_bytes(f"{name}/{MANIFEST}")
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{where}: manifest.json is missing") from exc
    return decode_manifest(data, where)


def chunks(view: memoryview) -> Iterator[memoryview]:
    for start in range(0, len(view), CHUNK):
        yield view[start : start + CHUNK]


def stream_file(
    storage: Storage,
    name: str,
    file: str,
    meta: FileEntry,
    dests: Iterable[memoryview],
    live: bool = False,
    filled: Callable[[int], None] | None = None,
) -> None:
    """Read one data file, in order, into ``dests`` (which cover it exactly), verifying its
    size and checksum; ``filled(k)`` is called once destination ``k`` holds its bytes.
    Hashing a piece overlaps reading the next (both release the GIL), so a destination
    must not be reused by the piece right after it."""
    where = storage.child_url(f"{name}/{file}")
    size = int(meta["size"])
    try:
        actual = storage.size(f"{name}/{file}")
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{where} is missing") from exc
    if actual != size:
        raise CorruptCheckpointError(f"{where} is {actual} bytes, manifest says {size} (truncated)")
    hasher = xxhash.xxh3_64()
    reader = storage.open_reader(f"{name}/{file}")
    pending: Future[None] | None = None
    pos = 0
    try:
        for k, dest in enumerate(dests):
            got = 0
            while got < len(dest):
                n = reader.readinto(dest[got:])
                if n <= 0:
                    raise CorruptCheckpointError(f"{where} ended early at byte {pos + got}")
                got += n
            if filled is not None:
                filled(k)
            if pending is not None:
                pending.result()
            pending = submit(_hash_pool, hasher.update, dest)
            pos += got
    except OSError as exc:
        raise StorageError(f"cannot read {where}: {exc}") from exc
    finally:
        if pending is not None:
            pending.result()
        reader.close()
    assert pos == size, "destinations must cover the file"
    if hasher.hexdigest() != meta.get("xxh3_64"):
        note = " (the live tensors it was loading into got part of it)" if live else ""
        raise CorruptCheckpointError(f"{where}: checksum mismatch (the file was damaged){note}")


def verify(storage: Storage, name: str) -> Manifest:
    """Check the manifest and every file; raises CorruptCheckpointError, returns the manifest.
    Reads through two small buffers: verifying costs no memory of the checkpoint's size."""
    manifest = read_manifest(storage, name)
    bounce = [memoryview(bytearray(CHUNK)), memoryview(bytearray(CHUNK))]
    for file, meta in manifest["files"].items():
        size = int(meta["size"])
        dests = (bounce[k % 2][: min(CHUNK, size - at)] for k, at in enumerate(range(0, size, CHUNK)))
        stream_file(storage, name, file, meta, dests)
    return manifest
