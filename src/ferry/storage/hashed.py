"""Durable writes and copies that checksum (xxh3-64) the bytes as they stream.

Used by the commit transaction, which records each file's size and digest in the
manifest; nothing else writes checkpoint data.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import xxhash

from ferry.errors import StorageError
from ferry.knobs import WRITE_BOUNCE_BYTES, WRITE_CHUNK_BYTES, WRITE_SMALL_BYTES
from ferry.progress import written as count_written
from ferry.storage.base import LocalFiles, Storage
from ferry.storage.pools import submit

Data = memoryview | bytes | Iterable[memoryview]
"""One buffer, or consecutive segments of one file (a list, or a stream of chunks)."""

_hash_pool = ThreadPoolExecutor(1, thread_name_prefix="ferry-hash")


def chunks(data: Data) -> Iterator[memoryview]:
    """The bytes of ``data`` (one view or consecutive segments) in chunks of <= WRITE_CHUNK_BYTES.

    A segment must stay valid only until the next one is requested (it may be a reused
    read buffer).

    Big segments are cut without a copy; runs of small ones (many tiny tensors, padding)
    are gathered into one bounce buffer, so a checkpoint of 10,000 biases is not 10,000
    syscalls. A yielded chunk is valid until the next one is requested.
    """
    segments = [memoryview(data)] if isinstance(data, (memoryview, bytes)) else data
    fill = 0
    out = memoryview(b"")
    for seg in segments:
        seg = seg.cast("B") if seg.format != "B" or seg.ndim != 1 else seg
        if len(seg) < WRITE_SMALL_BYTES:
            if not out:
                out = memoryview(bytearray(WRITE_BOUNCE_BYTES))
            if fill + len(seg) > len(out):
                yield out[:fill]
                fill = 0
            out[fill : fill + len(seg)] = seg
            fill += len(seg)
            continue
        if fill:
            yield out[:fill]
            fill = 0
        for start in range(0, len(seg), WRITE_CHUNK_BYTES):
            yield seg[start : start + WRITE_CHUNK_BYTES]
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


def write_hashed(
    storage: Storage, rel: str, data: Data, expect: tuple[int, str] | None = None
) -> tuple[int, str]:
    """Write ``data`` durably to ``rel``; returns its (size, xxh3-64 hex digest).

    Hashing a chunk runs on another thread while the same chunk is written (xxhash and
    os.write both release the GIL), so the checksum costs almost no wall time. With
    ``expect``, bytes of another size or digest fail the write before it is made durable.
    """
    hasher = xxhash.xxh3_64()
    writer = storage.open_writer(rel)
    writeback = _Writeback(storage.local_path(rel) if isinstance(storage, LocalFiles) else None)
    written = 0
    try:
        for chunk in chunks(data):
            fut = submit(_hash_pool, hasher.update, chunk)
            try:
                writer.write(chunk)
            finally:
                fut.result()  # the chunk (maybe the bounce buffer) is reused next
            written += len(chunk)
            count_written(len(chunk))  # a save's progress (ferry.progress.counting)
            writeback.kick(written)
        if expect is not None and (written, hasher.hexdigest()) != expect:
            raise StorageError(
                f"{storage.child_url(rel)}: the bytes written differ from their source's manifest "
                "(size or checksum); the source changed or is damaged"
            )
        writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        writeback.close()
    return written, hasher.hexdigest()


def read_chunks(storage: Storage, rel: str) -> Iterator[memoryview]:
    """The bytes of a file, streamed in chunks valid until the next one is requested."""
    reader = storage.open_reader(rel)
    try:
        buffer = memoryview(bytearray(WRITE_CHUNK_BYTES))
        while n := reader.readinto(buffer):
            yield buffer[:n]
    finally:
        reader.close()


def hash_file(storage: Storage, rel: str) -> tuple[int, str]:
    """(size, xxh3-64 hex digest) of a file already written, read back in chunks."""
    hasher, size = xxhash.xxh3_64(), 0
    for chunk in read_chunks(storage, rel):
        hasher.update(chunk)
        size += len(chunk)
    return size, hasher.hexdigest()
