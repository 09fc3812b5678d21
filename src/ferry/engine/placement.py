"""Where each byte of a data file goes when it is loaded, so every tensor owns its memory.

A loaded tensor must hold exactly its own bytes: a tensor that is a view of a buffer
shared with its neighbours keeps the whole buffer alive, ``torch.save`` of it writes the
whole buffer, and handing its storage to another process (DataLoader workers,
``share_memory_()``, DLPack, CUDA IPC) carries the whole buffer too. So:

- a live tensor that takes the checkpoint's bytes as they are is read into directly;
- a big tensor gets a fresh buffer of its own size and is read into directly;
- small tensors, where one read call each would cost more than the bytes, are read in
  batches through two reused bounce buffers and each copied out into its own tensor
  (cut in runs of one dtype by one call, then cloned);
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


Member = tuple[int, list[int] | None, bool] | None
"""A piece of a run (below): a small tensor's index, its shape (None when it is the run's
1-D piece as it is), and whether it is copied out as raw bytes (a numpy array's, decoded
later); None for the padding between two tensors."""


@dataclass
class Run:
    """Consecutive small tensors of one dtype in a bounce buffer, and the padding between
    them: one ``split_with_sizes`` of the buffer seen as that dtype cuts all of them, each
    then cloned into memory of its own. A view made per tensor (``as_strided``, a slice)
    cost more than the clone."""

    dtype: torch.dtype
    start: int
    """Element offset of its first tensor in the buffer seen as ``dtype``."""
    end: int
    sizes: list[int] = field(default_factory=list)
    members: list[Member] = field(default_factory=list)


@dataclass
class FilePlan:
    """The pieces one data file is read into, in file order, and the tensors they make:
    ``values`` (decoded, in memory of their own) and ``owners`` (raw bytes, to decode).

    Both are complete once every piece has been read and ``filled`` called on it."""

    pieces: list[memoryview] = field(default_factory=list)
    owners: dict[int, Owner] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    copy_outs: dict[int, tuple[torch.Tensor, list[Run]]] = field(default_factory=dict)
    """Piece index -> (the bounce buffer it lies in, the runs of small tensors in it)."""

    def filled(self, piece: int) -> None:
        """Piece ``piece`` has been read: copy its small tensors out, each into memory of
        its own, before its bounce buffer is read into again."""
        batch = self.copy_outs.pop(piece, None)
        if batch is None:
            return
        buf, runs = batch
        typed: dict[torch.dtype, torch.Tensor] = {}
        for run in runs:
            view = typed.get(run.dtype)
            if view is None:
                view = typed[run.dtype] = buf.view(run.dtype)
            parts = view[run.start : run.end].split_with_sizes(run.sizes)
            for part, member in zip(parts, run.members, strict=True):
                if member is None:
                    continue
                i, shape, raw = member
                own = part.clone()
                if shape is not None:
                    own = own.view(shape)
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
        lead = batch_start % ALIGN
        buf = bounce.take()
        runs: list[Run] = []
        for i in batch:
            e = entries[i]
            raw = e["kind"] != "torch"  # numpy: raw bytes of its own, decoded as the big ones are
            dtype = torch.uint8 if raw else torch_dtype(e["dtype"])
            # The batch lies in the buffer at the file's alignment: every tensor's byte offset
            # there is then a multiple of its item size (which divides ALIGN), as in the file.
            at = (lead + e["offset"] - batch_start) // dtype.itemsize
            count = e["nbytes"] // dtype.itemsize
            run = runs[-1] if runs and runs[-1].dtype is dtype else None
            if run is None:
                run = Run(dtype, at, at)
                runs.append(run)
            elif at > run.end:  # the padding before it, a piece of its own
                run.sizes.append(at - run.end)
                run.members.append(None)
            shape = e["shape"]
            run.sizes.append(count)
            run.members.append((i, None if raw or (len(shape) == 1 and shape[0] == count) else shape, raw))
            run.end = at + count
        plan.copy_outs[len(plan.pieces)] = (buf, runs)
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
