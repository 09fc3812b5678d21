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

import ctypes
import os
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeGuard

import numpy as np
import torch

from ferry.engine.codec import Flattened, TensorEntry, layout, torch_dtype
from ferry.engine.deferred import Deferred
from ferry.engine.probe import Probe
from ferry.engine.runs import copy_run, run_end
from ferry.errors import bug
from ferry.format.wire import ALIGN
from ferry.knobs import WRITE_BOUNCE_BYTES, WRITE_SMALL_BYTES
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


def _pieces(jobs: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each (destination, source) cut into ``COPY_CHUNK`` pieces."""
    step = COPY_CHUNK
    return [(d[a : a + step], s[a : a + step]) for d, s in jobs for a in range(0, len(s), step)]


def _pool() -> ThreadPoolExecutor:
    global _copy_pool
    if _copy_pool is None:
        _copy_pool = ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="ferry-snapshot")
    return _copy_pool


def _copy_host(jobs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """memcpy host -> host in 8 MiB pieces, the calling thread and a few copy threads
    taking pieces from one queue (numpy releases the GIL).

    The caller copies too, and waits only for the pieces a copy thread took: a thread the
    OS is slow to schedule (a busy node) then delays nothing, and a copy of a few MiB is
    not slowed by handing it over. (torch's intra-op copy splits each tensor evenly over
    its threads and waits for the slowest, which doubled the snapshot time on a loaded
    2-core machine; handing every piece to the pool and waiting took 5 to 30 ms to copy
    6 MiB there.)"""
    pieces = _pieces(jobs)
    if not pieces:
        return
    queue = _Queue(pieces)
    if COPY_THREADS > 1 and len(pieces) > 1:
        pool = _pool()
        for _ in range(min(COPY_THREADS, len(pieces)) - 1):
            submit(pool, queue.run)
    queue.run()
    queue.wait()


class _Queue:
    """Pieces to copy, taken one at a time by whichever thread asks next."""

    def __init__(self, pieces: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self._pieces = iter(pieces)
        self._idle = threading.Condition()
        self._busy = 0
        self._error: BaseException | None = None

    def run(self) -> None:
        """Copy pieces until none is left."""
        while True:
            with self._idle:
                piece = next(self._pieces, None)
                if piece is None:
                    return
                self._busy += 1
            try:
                np.copyto(piece[0], piece[1])
            except BaseException as exc:  # any: the caller raises it
                self._error = exc
            finally:
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()

    def wait(self) -> None:
        """Until every piece taken is copied; raises a copy's error."""
        with self._idle:
            self._idle.wait_for(lambda: self._busy == 0)
        if self._error is not None:
            raise self._error


def _start_host(pieces: list[tuple[np.ndarray, np.ndarray]]) -> list[Future[None]]:
    """The pieces' copies, queued on the copy threads."""
    pool = _pool()
    return [submit(pool, np.copyto, d, s) for d, s in pieces]


PACK_MAX = WRITE_SMALL_BYTES
"""Tensors below this are copied by address, one ``memmove`` each, into a buffer they share
with their neighbours; bigger ones go through numpy's copy on threads, or are written
from where they are."""
PACK_BYTES = WRITE_BOUNCE_BYTES
"""The buffer a synchronous save packs small tensors into, reused for each pack."""
if PACK_BYTES < 2 * PACK_MAX:
    raise bug("the pack buffer must hold two of the largest packed pieces")


_COMPLEX = frozenset(("complex64", "complex128"))


def _packable(arr: torch.Tensor | np.ndarray, entry: TensorEntry) -> TypeGuard[torch.Tensor]:
    """A small tensor whose bytes lie in host memory, in order, as they are: copied by
    address. A torch op costs about a microsecond in dispatch, the bytes of a small tensor
    less; viewing a tensor as bytes took two ops and copying it a third. Tensor subclasses
    (which may not keep their values at ``data_ptr``) and numpy arrays take the general
    path. ``entry.device`` says where the tensor is (asking the tensor costs more)."""
    return (
        entry.nbytes < PACK_MAX
        and entry.device == "cpu"
        and (type(arr) is torch.Tensor or type(arr) is torch.nn.Parameter)
        and arr.is_contiguous()
        and (entry.dtype not in _COMPLEX or not arr.is_conj())  # only these are conjugated
        and not arr.is_neg()
    )


def snapshot(
    flat: Flattened, buffer: HostBuffer, defer: Mapping[int, object] | None = None
) -> tuple[torch.Tensor, int, Deferred | None]:
    """Copy every array of ``flat`` into ``buffer``; returns (flat bytes, size, the copies
    left running). The gaps between arrays are zeroed (the buffer is reused from save to
    save).

    ``defer`` (``overlap_snapshot``): the tensors, by ``data_ptr``, that only an optimizer's
    step changes, each with what names it in a message (its ``str``). Those of them big
    enough to matter are copied after this returns (``ferry.engine.deferred``): the bytes
    are the snapshot's only once the returned ``Deferred`` was waited for."""
    size = layout(flat.entries)
    on_cuda = any(e.device.startswith("cuda") for e in flat.entries)
    host = buffer.get(size, pinned=on_cuda)
    host_np = host.numpy()
    base = host.data_ptr()
    jobs: list[tuple[np.ndarray, np.ndarray]] = []
    later = _DeferredCopies(defer) if defer else None
    entries, arrays = flat.entries, flat.arrays
    pos, i, n = 0, 0, len(entries)
    while i < n:
        entry, arr = entries[i], arrays[i]
        nbytes = entry.nbytes
        i += 1
        if nbytes == 0:
            continue
        offset = entry.offset
        if offset > pos:
            ctypes.memset(base + pos, 0, offset - pos)
        pos = offset + nbytes
        end = run_end(entries, arrays, i - 1)  # type: ignore[arg-type]
        if end > i:  # a run of small tensors: one copy
            last = entries[end - 1]
            pos = last.offset + last.nbytes
            copy_run(arrays[i - 1 : end], host[offset:pos], entry.dtype)  # type: ignore[arg-type]
            i = end
            continue
        if _packable(arr, entry):
            ctypes.memmove(base + offset, arr.data_ptr(), nbytes)
            continue
        if later is not None and later.take(arr, host[offset:pos]):
            continue
        src = _host_bytes(arr)
        if src is not None:
            jobs.append((host_np[offset:pos], src))
        else:
            if not isinstance(arr, torch.Tensor):
                raise bug("an array without host bytes that is not a tensor")
            dst = host[offset:pos]
            dst.view(torch_dtype(entry.dtype)).view(arr.shape).copy_(arr, non_blocking=on_cuda)
    if size > pos:
        ctypes.memset(base + pos, 0, size - pos)
    _copy_host(jobs)
    # Each copy was queued on its own device's stream: wait for every one of those devices,
    # not only the current one, before the buffer counts as the snapshot.
    for device in cuda_devices(flat.arrays) if on_cuda else ():
        torch.cuda.synchronize(device)
    return host, size, None if later is None else later.start()


class _DeferredCopies:
    """The copies of one snapshot deferred past its return (``overlap_snapshot``): gathered
    while the rest is copied, then started on the copy threads and side streams."""

    def __init__(self, defer: Mapping[int, object]) -> None:
        self.defer = defer
        self.host: list[tuple[np.ndarray, np.ndarray]] = []
        self.cuda: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.probe = Probe()

    def take(self, arr: torch.Tensor | np.ndarray, dst: torch.Tensor) -> bool:
        """Defer ``arr``'s copy into ``dst`` if it is one of ``defer``'s: a plain dense
        tensor (a subclass may keep its values elsewhere) on the host or a GPU."""
        if type(arr) is not torch.Tensor and type(arr) is not torch.nn.Parameter:
            return False
        name = self.defer.get(arr.data_ptr())
        if name is None or not arr.is_contiguous() or arr.is_conj() or arr.is_neg():
            return False
        if arr.is_cuda:
            self.cuda.append((dst, arr))
            self.probe.cuda(name, arr, dst)
        elif arr.is_cpu:
            dst_bytes, src_bytes = dst.numpy(), arr.detach().reshape(-1).view(torch.uint8).numpy()
            self.host.append((dst_bytes, src_bytes))
            self.probe.host(name, arr, src_bytes, dst_bytes)
        else:
            return False
        return True

    def start(self) -> Deferred:
        """Queue the copies: host ones on the copy threads, each GPU's on a side stream that
        first waits for the work already queued on the device's current stream. The probe's
        first reads come before any copy, its third after each GPU's (``ferry.engine.probe``)."""
        self.probe.first()
        done = []
        by_device: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for dst, src in self.cuda:
            by_device.setdefault(src.device, []).append((dst, src))
        for device, copies in by_device.items():
            side = _side_stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for dst, src in copies:
                    dst.view(src.dtype).view(src.shape).copy_(src, non_blocking=True)
                    src.record_stream(side)  # its memory is not reused before the copy ran
                self.probe.again_cuda(device, side)
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record(side)
            done.append(event)
        return Deferred(_start_host(_pieces(self.host)), done, self.probe)


_side_streams: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    stream = _side_streams.get(device)
    if stream is None:
        stream = _side_streams[device] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    return stream


def cuda_devices(arrays: list[torch.Tensor | np.ndarray]) -> set[torch.device]:
    """The CUDA devices that ``arrays`` live on."""
    return {a.device for a in arrays if isinstance(a, torch.Tensor) and a.is_cuda}


def direct_segments(flat: Flattened) -> tuple[Iterator[memoryview], int] | None:
    """The data file of ``flat``, padding included, as consecutive byte views: big arrays
    as views of themselves, runs of small ones (and the padding) packed into one reused
    buffer, so that 20,000 small tensors are a few writes and a few checksum calls.

    Only for a synchronous save, where nothing changes the arrays until the write is over.
    A view is valid until the next one is requested (the pack buffer is reused), as the
    writer (``storage.hashed.chunks``) allows. Big contiguous CPU arrays are not copied;
    other big ones are made contiguous (a copy of that one array). Returns None when an
    array is not in host memory (a snapshot is needed)."""
    if any(e.device != "cpu" for e in flat.entries):  # numpy arrays' entries say "cpu"
        return None
    size = layout(flat.entries)
    return _segments(flat.entries, flat.arrays, size), size


def _segments(
    entries: list[TensorEntry], arrays: list[torch.Tensor | np.ndarray], size: int
) -> Iterator[memoryview]:
    pack = torch.empty(PACK_BYTES, dtype=torch.uint8)
    base, view = pack.data_ptr(), byte_view(pack)
    memmove, zeros = ctypes.memmove, memoryview(bytes(ALIGN))
    fill = 0  # bytes in the pack, which holds the file's bytes up to ``pos``
    pos, i, n = 0, 0, len(entries)
    while i < n:
        entry, arr = entries[i], arrays[i]
        nbytes = entry.nbytes
        i += 1
        if nbytes == 0:
            continue
        gap = entry.offset - pos  # padding, < ALIGN: into the pack
        if fill and fill + gap + nbytes > PACK_BYTES:
            yield view[:fill]
            fill = 0
        if gap:
            view[fill : fill + gap] = zeros[:gap]
            fill += gap
        pos = entry.offset + nbytes
        end = run_end(entries, arrays, i - 1)  # type: ignore[arg-type]
        if end > i:  # a run of small tensors: one copy, into the pack emptied first
            if fill:  # (its start is then aligned for the run's dtype)
                yield view[:fill]
                fill = 0
            last = entries[end - 1]
            fill, pos = last.offset + last.nbytes - entry.offset, last.offset + last.nbytes
            copy_run(arrays[i - 1 : end], pack[:fill], entry.dtype)  # type: ignore[arg-type]
            i = end
            continue
        if _packable(arr, entry):
            memmove(base + fill, arr.data_ptr(), nbytes)
            fill += nbytes
            continue
        if fill:
            yield view[:fill]
            fill = 0
        data = _host_bytes(arr)
        if data is None:  # strided, or a conj/neg view: a contiguous copy of this one
            if not isinstance(arr, torch.Tensor):
                raise bug("an array without host bytes that is not a tensor")
            data = _host_bytes(arr.resolve_conj().resolve_neg().contiguous())
            if data is None:
                raise bug("a contiguous host copy without host bytes")
        yield memoryview(data).cast("B")  # type: ignore[arg-type]
    if size > pos:
        if fill and fill + size - pos > PACK_BYTES:
            yield view[:fill]
            fill = 0
        ctypes.memset(base + fill, 0, size - pos)
        fill += size - pos
    if fill:
        yield view[:fill]
