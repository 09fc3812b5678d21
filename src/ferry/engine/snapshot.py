"""Device-to-host snapshot into host buffers that are allocated once and reused.

The snapshot is the only part of a save that blocks training: after it returns, the
training loop may change every tensor and the checkpoint still holds the values of the
moment of the snapshot.

A synchronous save needs no snapshot at all (the caller is blocked until the commit, so
nothing changes under it): ``direct_segments`` hands the writer the bytes of the live CPU
tensors themselves, which saves a full copy of the state and the page faults of a fresh
buffer.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ferry.engine.format import ALIGN, Flattened, layout, torch_dtype
from ferry.errors import bug
from ferry.storage.pools import submit


class HostBuffer:
    """One flat uint8 host buffer, grown when needed, pinned when the state is on CUDA."""

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None
        self._pinned = False

    @property
    def capacity(self) -> int:
        return 0 if self._buf is None else self._buf.numel()

    def get(self, nbytes: int, pinned: bool) -> torch.Tensor:
        if self._buf is None or self._buf.numel() < nbytes or (pinned and not self._pinned):
            self._buf = None  # drop the old one before allocating: peak stays ~1x
            want_pin = pinned and torch.cuda.is_available()
            self._buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=want_pin)
            self._pinned = want_pin
        return self._buf[:nbytes]

    def release(self) -> None:
        self._buf = None


def byte_view(t: torch.Tensor) -> memoryview:
    """A flat byte view of a contiguous CPU uint8 tensor, without a copy."""
    return memoryview(t.numpy()).cast("B")  # type: ignore[arg-type]


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor of any dtype, without a copy (writable)."""
    return byte_view(t.detach().reshape(-1).view(torch.uint8))


COPY_CHUNK = 8 << 20
COPY_THREADS = max(1, min(4, os.cpu_count() or 1))
_copy_pool: ThreadPoolExecutor | None = None


def _host_bytes(arr: torch.Tensor | np.ndarray) -> np.ndarray | None:
    """The bytes of a host array as a flat uint8 numpy view, or None (strided, on a GPU,
    a conj/neg view: those go through torch's copy)."""
    if isinstance(arr, np.ndarray):
        return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    if arr.device.type != "cpu" or not arr.is_contiguous() or arr.is_conj() or arr.is_neg():
        return None
    return arr.detach().reshape(-1).view(torch.uint8).numpy()


def _copy_host(jobs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """memcpy host -> host in 8 MiB pieces on a few threads (numpy releases the GIL).

    Pieces are taken from a shared queue, so a thread the OS is slow to schedule (a busy
    node) delays its own piece only; torch's intra-op copy splits each tensor evenly over
    its threads and waits for the slowest, which doubled the snapshot time on a loaded
    2-core machine."""
    global _copy_pool
    pieces = [
        (d[a : a + COPY_CHUNK], s[a : a + COPY_CHUNK]) for d, s in jobs for a in range(0, len(s), COPY_CHUNK)
    ]
    if COPY_THREADS == 1 or len(pieces) < 2:
        for d, s in pieces:
            np.copyto(d, s)
        return
    if _copy_pool is None:
        _copy_pool = ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="ferry-snapshot")
    for fut in [submit(_copy_pool, np.copyto, d, s) for d, s in pieces]:
        fut.result()


def snapshot(flat: Flattened, buffer: HostBuffer) -> tuple[torch.Tensor, int]:
    """Copy every array of ``flat`` into ``buffer``; returns (flat bytes, size)."""
    size = layout(flat.entries)
    on_cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in flat.arrays)
    host = buffer.get(size, pinned=on_cuda)
    host_np = host.numpy()
    jobs: list[tuple[np.ndarray, np.ndarray]] = []
    for entry, arr in zip(flat.entries, flat.arrays, strict=True):
        if entry.nbytes == 0:
            continue
        src = _host_bytes(arr)
        if src is not None:
            jobs.append((host_np[entry.offset : entry.offset + entry.nbytes], src))
        else:
            if not isinstance(arr, torch.Tensor):
                raise bug("an array without host bytes that is not a tensor")
            dst = host[entry.offset : entry.offset + entry.nbytes]
            dst.view(torch_dtype(entry.dtype)).view(arr.shape).copy_(arr, non_blocking=on_cuda)
    _copy_host(jobs)
    # Each copy was queued on its own device's stream: wait for every one of those devices,
    # not only the current one, before the buffer counts as the snapshot.
    for device in cuda_devices(flat.arrays):
        torch.cuda.synchronize(device)
    return host, size


def cuda_devices(arrays: list[torch.Tensor | np.ndarray]) -> set[torch.device]:
    """The CUDA devices that ``arrays`` live on."""
    return {a.device for a in arrays if isinstance(a, torch.Tensor) and a.is_cuda}


def direct_segments(flat: Flattened) -> tuple[list[memoryview], int] | None:
    """The data file of ``flat`` as byte views of the arrays themselves, padding included.

    Only for a synchronous save, where nothing changes the arrays until the write is over.
    Contiguous CPU arrays are not copied; others are made contiguous (a copy of that one
    array). Returns None when an array is not in host memory (a snapshot is needed).
    """
    if any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in flat.arrays):
        return None
    size = layout(flat.entries)
    segments: list[memoryview] = []
    pos = 0
    for entry, arr in zip(flat.entries, flat.arrays, strict=True):
        if entry.nbytes == 0:
            continue
        if entry.offset > pos:
            segments.append(memoryview(bytes(entry.offset - pos)))
        data = _host_bytes(arr)
        if data is None:  # strided, or a conj/neg view: a contiguous copy of this one
            if not isinstance(arr, torch.Tensor):
                raise bug("an array without host bytes that is not a tensor")
            data = _host_bytes(arr.resolve_conj().resolve_neg().contiguous())
            if data is None:
                raise bug("a contiguous host copy without host bytes")
        segments.append(memoryview(data).cast("B"))  # type: ignore[arg-type]
        pos = entry.offset + entry.nbytes
    if size > pos:
        segments.append(memoryview(bytes(size - pos)))
    if not (size - pos < ALIGN and sum(len(s) for s in segments) == size):
        raise bug("the direct segments do not cover the data file")
    return segments, size
