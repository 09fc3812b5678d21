"""Where each byte of a data file goes when it is loaded, so every tensor owns its memory.

A loaded tensor must hold exactly its own bytes: a tensor that is a view of a buffer
shared with its neighbours keeps the whole buffer alive, ``torch.save`` of it writes the
whole buffer, and handing its storage to another process (DataLoader workers,
``share_memory_()``, DLPack, CUDA IPC) carries the whole buffer too. So:

- a live tensor that takes the checkpoint's bytes as they are is read into directly;
- a big tensor gets a fresh buffer of its own size and is read into directly;
- small tensors, where one read call each would cost more than the bytes, are read in
  batches through two reused bounce buffers and each copied out into its own tensor;
- tensors whose bytes overlap in the file (never written by ferry: a file written
  elsewhere whose tensors are views of one base) share one buffer of their joint span,
  as the views did;
- padding goes to throwaway scratch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ferry.engine.format import ALIGN, torch_dtype
from ferry.engine.integrity import CHUNK
from ferry.engine.manifest import TensorRecord
from ferry.engine.snapshot import byte_view, tensor_bytes

DIRECT_MIN = 256 << 10
"""Tensors below this are read through the bounce buffers: not worth a read call each."""

Owner = tuple[torch.Tensor, int]
"""The host buffer a tensor's bytes ended in, and their offset there."""


class Bounce:
    """Two reused host buffers that batches of small tensors are read into, alternately:
    a piece is still being hashed while the next one is read, so two pieces in a row
    never share a buffer. Allocated on first use, ``size`` bytes (and an alignment's
    worth) each."""

    def __init__(self, size: int = CHUNK) -> None:
        self.size = size
        self._bufs: list[torch.Tensor] = []
        self._turn = 0

    def take(self) -> torch.Tensor:
        if len(self._bufs) < 2:
            self._bufs.append(torch.empty(self.size + ALIGN, dtype=torch.uint8))
        buf = self._bufs[self._turn % len(self._bufs)]
        self._turn += 1
        return buf


Member = tuple[int, torch.dtype, list[int], list[int], int, bool]
"""A small tensor of a batch: its index, dtype, shape, strides, element offset in the
bounce buffer seen as that dtype, and whether it is copied out as raw bytes (a numpy
array's, decoded later)."""


def _strides(shape: list[int]) -> list[int]:
    out, step = [], 1
    for dim in reversed(shape):
        out.append(step)
        step *= dim
    return out[::-1]


@dataclass
class FilePlan:
    """The pieces one data file is read into, in file order, and the tensors they make:
    ``values`` (decoded, in memory of their own) and ``owners`` (raw bytes, to decode).

    Both are complete once every piece has been read and ``filled`` called on it."""

    pieces: list[memoryview] = field(default_factory=list)
    owners: dict[int, Owner] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    copy_outs: dict[int, tuple[torch.Tensor, list[Member]]] = field(default_factory=dict)
    """Piece index -> (the bounce buffer it lies in, the small tensors in it)."""

    def filled(self, piece: int) -> None:
        """Piece ``piece`` has been read: copy its small tensors out, each into memory of
        its own, before its bounce buffer is read into again. One typed view of the
        buffer per dtype, one ``as_strided(...).clone()`` per tensor: cheaper than the
        slice, view and reshape that decoding a tensor of a shared buffer costs."""
        batch = self.copy_outs.pop(piece, None)
        if batch is None:
            return
        buf, members = batch
        typed: dict[torch.dtype, torch.Tensor] = {}
        for i, dtype, shape, strides, at, raw in members:
            view = typed.get(dtype)
            if view is None:
                view = typed[dtype] = buf.view(dtype)
            own = view.as_strided(shape, strides, at).clone()
            if raw:
                self.owners[i] = (own, 0)
            else:
                self.values[i] = own


Unit = tuple[int, int, list[int]]
"""Tensors that share bytes of a file: the span they cover (start, end) and their indices.
Ferry writes every tensor apart, so a unit is then one tensor."""


def _units(spans: list[tuple[int, int, int]]) -> list[Unit]:
    """``spans`` (start, end, index), sorted, grouped into units, in file order."""
    units: list[Unit] = []
    for start, end, i in spans:
        if units and start < units[-1][1]:
            first, last, members = units[-1]
            units[-1] = (first, max(last, end), [*members, i])
        else:
            units.append((start, end, [i]))
    return units


def plan_file(
    entries: list[TensorRecord], file: str, size: int, targets: dict[int, torch.Tensor], bounce: Bounce
) -> FilePlan:
    """Where each byte of ``file`` (``size`` bytes) goes; ``targets`` maps tensor indices to
    the live tensors their bytes are read straight into (never tensors that share bytes)."""
    plan = FilePlan()
    spans: list[tuple[int, int, int]] = []
    for i, e in enumerate(entries):
        if e["file"] != file:
            continue
        if e["nbytes"]:
            spans.append((e["offset"], e["offset"] + e["nbytes"], i))
        else:
            plan.owners[i] = (torch.empty(0, dtype=torch.uint8), 0)
    spans.sort()
    pos = 0
    batch: list[int] = []
    batch_start = 0

    scratch: list[memoryview] = []

    def skip_to(upto: int) -> None:
        # Padding goes to two scratch buffers in turn (the previous piece may still be
        # hashed while the next is read): a file with a big gap costs no more memory.
        nonlocal pos
        while pos < upto:
            n = min(CHUNK, upto - pos)
            if n <= ALIGN:  # alignment padding: a few bytes of its own
                plan.pieces.append(memoryview(bytearray(n)))
            else:
                if not scratch:
                    scratch.extend(memoryview(bytearray(CHUNK)) for _ in range(2))
                plan.pieces.append(scratch[len(plan.pieces) % 2][:n])
            pos += n

    def add(view: memoryview) -> None:
        plan.pieces.extend(view[at : at + CHUNK] for at in range(0, len(view), CHUNK))

    def flush() -> None:
        nonlocal pos
        if not batch:
            return
        end = entries[batch[-1]]["offset"] + entries[batch[-1]]["nbytes"]
        # The batch lies in the buffer at the file's alignment: every tensor's byte offset
        # there is then a multiple of its item size (which divides ALIGN), as in the file.
        lead = batch_start % ALIGN
        buf = bounce.take()
        members: list[Member] = []
        for i in batch:
            e = entries[i]
            if e["kind"] == "torch":
                dtype = torch_dtype(e["dtype"])
                at = (lead + e["offset"] - batch_start) // dtype.itemsize
                members.append((i, dtype, e["shape"], _strides(e["shape"]), at, False))
            else:  # numpy: raw bytes of its own, decoded as the big ones are
                at = lead + e["offset"] - batch_start
                members.append((i, torch.uint8, [e["nbytes"]], [1], at, True))
        plan.copy_outs[len(plan.pieces)] = (buf, members)
        plan.pieces.append(byte_view(buf[lead : lead + end - batch_start]))
        pos = end
        batch.clear()

    for start, end, unit in _units(spans):
        if len(unit) == 1 and unit[0] not in targets and end - start < DIRECT_MIN:
            if batch and end - batch_start > bounce.size:
                flush()
            if not batch:
                skip_to(start)
                batch_start = start
            batch.append(unit[0])
            continue
        flush()
        skip_to(start)
        if len(unit) == 1 and unit[0] in targets:
            add(tensor_bytes(targets[unit[0]]))
        else:  # one big tensor, or tensors sharing bytes: a buffer of their own span
            buf = torch.empty(end - start, dtype=torch.uint8)
            for i in unit:
                plan.owners[i] = (buf, entries[i]["offset"] - start)
            add(byte_view(buf))
        pos = end
    flush()
    skip_to(size)
    return plan
