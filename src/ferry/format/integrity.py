"""Check a checkpoint without loading it: its manifest, then each file's size and checksum.

Torch-free (manifest.py, wire.py, xxhash and the storage layer only), so ``ferry verify``
and ``ferry inspect`` start fast; reader.py loads through the same ``stream_file``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import xxhash

from ferry.errors import CorruptCheckpointError, FerryError
from ferry.format.manifest import FileEntry, Manifest, decode_manifest
from ferry.knobs import READ_CHUNK_BYTES
from ferry.storage import Reader, Storage
from ferry.storage.atomic import MANIFEST
from ferry.storage.pools import submit

CHUNK = READ_CHUNK_BYTES
_hash_pool = ThreadPoolExecutor(1, thread_name_prefix="ferry-verify")

HASH_AWAY_MIN = 1 << 20
"""Pieces of this size and more are hashed on another thread while the next is read (a
batch of small tensors, placement.BOUNCE_BYTES, is one); a smaller one (a tensor of its
own, a few hundred KiB) is hashed in place: handing it over cost about as much as hashing it."""

MAX_MANIFEST = 256 << 20
"""The largest manifest read (a million tensors take about 200 MB); a bigger one is refused
before it is read, whatever memory it would take to decode."""


def _unreadable(where: str, exc: OSError) -> CorruptCheckpointError:
    """An OS error on a checkpoint's file (permission, a folder where a file should be, a
    bad sector): the checkpoint cannot be used, so the next older one is tried."""
    return CorruptCheckpointError(f"cannot read {where}: {exc.strerror or exc}; the checkpoint is unreadable")


def read_manifest(storage: Storage, name: str) -> Manifest:
    """The manifest of checkpoint ``name``, checked whole (manifest.py) before any
    of its data is read."""
    where = storage.child_url(name)
    rel = f"{name}/{MANIFEST}"
    try:
        if storage.size(rel) > MAX_MANIFEST:
            raise CorruptCheckpointError(
                f"{where}: manifest.json is larger than {MAX_MANIFEST >> 20} MiB; not ferry's, refused"
            )
        data = storage.read_bytes(rel)
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{where}: manifest.json is missing") from exc
    except OSError as exc:
        raise _unreadable(storage.child_url(rel), exc) from exc
    if len(data) > MAX_MANIFEST:  # it grew after it was measured
        raise CorruptCheckpointError(f"{where}: manifest.json changed while it was read")
    return decode_manifest(data, where)


def open_checked(storage: Storage, name: str, file: str, meta: FileEntry) -> Reader:
    """Open a data file of checkpoint ``name`` for reading, once its size on disk is the
    manifest's: called before anything is allocated for its bytes, so a manifest cannot
    make a reader allocate more than the files hold."""
    rel = f"{name}/{file}"
    where = storage.child_url(rel)
    size = int(meta["size"])
    try:
        actual = storage.size(rel)
        if actual != size:
            raise CorruptCheckpointError(f"{where} is {actual} bytes, manifest says {size} (truncated)")
        return storage.open_reader(rel)
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{where} is missing") from exc
    except OSError as exc:
        raise _unreadable(where, exc) from exc


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
    reader: Reader | None = None,
) -> None:
    """Read one data file, in order, into ``dests`` (which cover it exactly), verifying its
    size and checksum; ``filled(k)`` is called once destination ``k`` holds its bytes.
    Hashing a piece overlaps reading the next (both release the GIL), so a destination
    must not be reused by the piece right after it. ``reader``: the file, opened already
    by ``open_checked``."""
    where = storage.child_url(f"{name}/{file}")
    size = int(meta["size"])
    if reader is None:
        reader = open_checked(storage, name, file, meta)
    hasher = xxhash.xxh3_64()
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
                pending = None
            if got < HASH_AWAY_MIN:
                hasher.update(dest)
            else:
                pending = submit(_hash_pool, hasher.update, dest)
            pos += got
    except OSError as exc:
        raise _unreadable(where, exc) from exc
    finally:
        if pending is not None:
            pending.result()
        reader.close()
    if pos != size:  # the plan covers the file; this is ferry's own check, not the file's
        raise FerryError(f"{where}: read {pos} of {size} bytes (a bug in ferry's read plan)")
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
