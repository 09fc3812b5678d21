"""Device-to-host snapshot into host buffers that are allocated once and reused.

The snapshot is the only part of a save that blocks training: after it returns, the
training loop may change every tensor and the checkpoint still holds the values of the
moment of the snapshot.
"""

from __future__ import annotations

import numpy as np
import torch

from ferry.engine.format import Flattened, layout, torch_dtype


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


def snapshot(flat: Flattened, buffer: HostBuffer) -> tuple[torch.Tensor, int]:
    """Copy every array of ``flat`` into ``buffer``; returns (flat bytes, size)."""
    size = layout(flat.entries)
    on_cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in flat.arrays)
    host = buffer.get(size, pinned=on_cuda)
    for entry, arr in zip(flat.entries, flat.arrays, strict=True):
        if entry.nbytes == 0:
            continue
        dst = host[entry.offset : entry.offset + entry.nbytes]
        if isinstance(arr, np.ndarray):
            src = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            dst.copy_(torch.from_numpy(src))
        else:
            dst.view(torch_dtype(entry.dtype)).view(arr.shape).copy_(arr, non_blocking=on_cuda)
    if on_cuda:
        torch.cuda.synchronize()
    return host, size
