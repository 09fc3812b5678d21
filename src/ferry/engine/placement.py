"""Where each byte of a data file goes when it is loaded, so every tensor owns its memory.

A loaded tensor must hold exactly its own bytes: a tensor that is a view of a buffer
shared with its neighbours keeps the whole buffer alive, ``torch.save`` of it writes the
whole buffer, and handing its storage to another process (DataLoader workers,
``share_memory_()``, DLPack, CUDA IPC) carries the whole buffer too. So:

- a live tensor that takes the checkpoint's bytes as they are is read into directly;
- a big tensor gets a fresh buffer of its own size and is read into directly;
- small tensors, where one read call each would cost more than the bytes, are read in
  batches through two reused bounce buffers and each copied out into its own tensor
  (a run of tensors of one dtype by one call);
- tensors whose bytes overlap in the file (never written by ferry: a file written
  elsewhere whose tensors are views of one base) share one buffer of their joint span,
  as the views did;
- padding goes to throwaway scratch.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ferry.engine.codec import torch_dtype
from ferry.engine.snapshot import byte_view, tensor_bytes
from ferry.format.integrity import CHUNK
from ferry.format.manifest import TensorRecord
from ferry.format.wire import ALIGN

DIRECT_MIN = 256 << 10
"""Tensors below this are read through the bounce buffers: not worth a read call each."""

_split_copy: Callable[[torch.Tensor, list[int]], list[torch.Tensor]] = torch.split_with_sizes_copy  # type: ignore[assignment]
"""``split_with_sizes`` whose pieces are fresh tensors (torch's stub knows only its
``out=`` form, which returns nothing)."""

Owner = tuple[torch.Tensor, int]
"""The host buffer a tensor's bytes ended in, and their offset there."""


BOUNCE_BYTES = 4 << 20
"""The size of each bounce buffer. Every load pays for faulting its pages in (a fresh
buffer's, from the system): two of 16 MiB (a read chunk) took a quarter of the time of
loading 20,000 tensors of 4 KiB, where a batch of a few MiB is as cheap to read and hash."""


class Bounce:
    """Two reused host buffers that batches of small tensors are read into, alternately:
    a piece is still being hashed while the next one is read, so two pieces in a row
    never share a buffer. Allocated on first use, ``size`` bytes (and an alignment's
    worth) each."""

    def __init__(self, size: int = BOUNCE_BYTES) -> None:
        self.size = size
        self._bufs: list[torch.Tensor] = []
        self._turn = 0

    def take(self) -> torch.Tensor:
        if len(self._bufs) < 2:
            self._bufs.append(torch.empty(self.size + ALIGN, dtype=torch.uint8))
        buf = self._bufs[self._turn % len(self._bufs)]
        self._turn += 1
        return buf


@dataclass
class Run:
    """Consecutive small tensors of one dtype in a bounce buffer, and the padding between
    them: one ``split_with_sizes_copy`` of the buffer seen as that dtype makes all of them,
    each in memory of its own, in one call (a clone per tensor, each a call from Python,
    cost as much again)."""

    dtype: torch.dtype
    raw: bool
    """A numpy array's bytes (``dtype`` is uint8): they are decoded later."""
    start: int
    """Element offset of its first tensor in the buffer seen as ``dtype``."""
    end: int
    sizes: list[int] = field(default_factory=list)
    index: list[int] = field(default_factory=list)
    """The tensor index of each piece; -1 for the padding between two tensors."""
    shapes: list[list[int] | None] = field(default_factory=list)
    """Each piece's shape, None where it is the 1-D piece as it is (or padding)."""


@dataclass
class FilePlan:
    """The pieces one data file is read into, in file order, and the tensors they make:
    ``values[i]`` (small torch tensors, decoded, in memory of their own) and ``owners``
    (raw bytes, to decode: big tensors, numpy arrays, tensors sharing bytes).

    Both are complete once every piece has been read and ``filled`` called on it."""

    values: list[Any]
    """One slot per tensor of the checkpoint (shared by the plans of all its files)."""
    pieces: list[memoryview] = field(default_factory=list)
    owners: dict[int, Owner] = field(default_factory=dict)
    copy_outs: dict[int, tuple[torch.Tensor, list[Run]]] = field(default_factory=dict)
    """Piece index -> (the bounce buffer it lies in, the runs of small tensors in it)."""

    def filled(self, piece: int) -> None:
        """Piece ``piece`` has been read: copy its small tensors out, each into memory of
        its own, before its bounce buffer is read into again."""
        batch = self.copy_outs.pop(piece, None)
        if batch is None:
            return
        buf, runs = batch
        values, owners = self.values, self.owners
        typed: dict[torch.dtype, torch.Tensor] = {}
        for run in runs:
            view = typed.get(run.dtype)
            if view is None:
                view = typed[run.dtype] = buf.view(run.dtype)
            parts = _split_copy(view[run.start : run.end], run.sizes)
            if run.raw:  # numpy arrays' bytes, decoded later
                for part, i in zip(parts, run.index, strict=True):
                    if i >= 0:
                        owners[i] = (part, 0)
                continue
            for part, i, shape in zip(parts, run.index, run.shapes, strict=True):
                if i >= 0:
                    values[i] = part if shape is None else part.view(shape)


def plan_file(
    entries: list[TensorRecord],
    file: str,
    size: int,
    targets: dict[int, torch.Tensor],
    bounce: Bounce,
    values: list[Any],
) -> FilePlan:
    """Where each byte of ``file`` (``size`` bytes) goes; ``targets`` maps tensor indices to
    the live tensors their bytes are read straight into (never tensors that share bytes).
    Small torch tensors land in ``values`` (one slot per entry), the rest in ``owners``."""
    plan = FilePlan(values)
    spans, shared = _spans(entries, file, plan)
    _Planner(entries, plan, bounce).place(spans, shared, targets, size)
    return plan


Span = tuple[int, int, int]
"""(start, end, a tensor's index): the bytes of ``file`` one tensor, or the tensors that
share bytes (overlapping spans), cover."""


def _spans(entries: list[TensorRecord], file: str, plan: FilePlan) -> tuple[list[Span], dict[int, list[int]]]:
    """The tensors of ``file`` in file order, and where tensors share bytes, the indices of
    all of them by their span's first tensor (empty when, as ferry writes, every tensor
    lies apart). An empty tensor gets an empty buffer in ``plan`` at once."""
    spans: list[Span] = []
    add = spans.append
    for i, e in enumerate(entries):
        if e["file"] != file:
            continue
        if nbytes := e["nbytes"]:
            add((offset := e["offset"], offset + nbytes, i))
        else:
            plan.owners[i] = (torch.empty(0, dtype=torch.uint8), 0)
    spans.sort()  # (in file order already when ferry wrote it: one pass)
    ends = [end for _, end, _ in spans]
    starts = [start for start, _, _ in spans]
    if all(map(operator.le, ends[:-1], starts[1:])):  # no two overlap: compared in C
        return spans, {}
    units: list[tuple[int, int, list[int]]] = []
    for start, end, i in spans:
        if units and start < units[-1][1]:
            first, last, members = units[-1]
            units[-1] = (first, max(last, end), [*members, i])
        else:
            units.append((start, end, [i]))
    return [(s, e, m[0]) for s, e, m in units], {m[0]: m for _, _, m in units if len(m) > 1}


class _Planner:
    """Appends the pieces of one file to ``plan`` in file order: padding to scratch, live
    tensors' and own buffers' bytes as they are, batches of small tensors to a bounce
    buffer. ``pos`` is the file offset the pieces so far reach."""

    def __init__(self, entries: list[TensorRecord], plan: FilePlan, bounce: Bounce) -> None:
        self.entries = entries
        self.plan = plan
        self.bounce = bounce
        self.pos = 0
        self.pending: list[tuple[int, int, int]] = []
        """The small tensors (start, end, index) of the batch not yet placed."""
        self.pending_start = 0
        self.specs: dict[str, tuple[torch.dtype, bool, int]] = {}
        """dtype name: (cut as, raw, item size)."""
        self.scratch: list[memoryview] = []

    def skip_to(self, upto: int) -> None:
        """Padding up to ``upto``. It goes to two scratch buffers in turn (the previous
        piece may still be hashed while the next is read): a big gap costs no more memory."""
        pieces, pos = self.plan.pieces, self.pos
        while pos < upto:
            n = min(CHUNK, upto - pos)
            if n <= ALIGN:  # alignment padding: a few bytes of its own
                pieces.append(memoryview(bytearray(n)))
            else:
                if not self.scratch:
                    self.scratch.extend(memoryview(bytearray(CHUNK)) for _ in range(2))
                pieces.append(self.scratch[len(pieces) % 2][:n])
            pos += n
        self.pos = pos

    def add(self, view: memoryview) -> None:
        self.plan.pieces.extend(view[at : at + CHUNK] for at in range(0, len(view), CHUNK))

    def place(
        self, spans: list[Span], shared: dict[int, list[int]], targets: dict[int, torch.Tensor], size: int
    ) -> None:
        """Every piece of the file, ``size`` bytes, its tensors' spans found by ``_spans``."""
        pending, limit, owners = self.pending, self.bounce.size, self.plan.owners
        for start, end, first in spans:
            if end - start < DIRECT_MIN and first not in targets and not (shared and first in shared):
                # A small tensor joins the batch (placed first if it would not fit its
                # bounce buffer), inline here: a call per tensor made planning 20,000
                # small tensors 3-9% slower.
                if pending and end - self.pending_start > limit:
                    self.flush()
                if not pending:
                    self.skip_to(start)
                    self.pending_start = start
                pending.append((start, end, first))
                continue
            self.flush()
            self.skip_to(start)
            members = shared.get(first) if shared else None
            if members is None and first in targets:
                self.add(tensor_bytes(targets[first]))
            else:  # one big tensor, or tensors sharing bytes: a buffer of their own span
                buf = torch.empty(end - start, dtype=torch.uint8)
                for i in members or [first]:
                    owners[i] = (buf, self.entries[i]["offset"] - start)
                self.add(byte_view(buf))
            self.pos = end
        self.flush()
        self.skip_to(size)

    def flush(self) -> None:
        """Place the batch: one piece of a bounce buffer, its runs copied out once read."""
        batch = self.pending
        if not batch:
            return
        end, batch_start = batch[-1][1], self.pending_start
        lead = batch_start % ALIGN
        buf = self.bounce.take()
        plan = self.plan
        plan.copy_outs[len(plan.pieces)] = (buf, self._runs(lead))
        plan.pieces.append(byte_view(buf[lead : lead + end - batch_start]))
        self.pos = end
        batch.clear()

    def _runs(self, lead: int) -> list[Run]:
        """The batch as runs of one dtype each, the batch lying in its buffer from ``lead``."""
        entries, specs = self.entries, self.specs
        base = lead - self.pending_start  # a file offset + base: its byte offset in the buffer
        runs: list[Run] = []
        run = Run(torch.uint8, False, 0, 0)  # a placeholder: the first tensor starts a run
        sizes, index, shapes, run_end, run_spec = run.sizes, run.index, run.shapes, 0, None
        for offset, stop, i in self.pending:
            e = entries[i]
            spec = specs.get(e["dtype"])
            if spec is None:  # (a checked record's dtype name says its kind: "float32", "<f4")
                raw = e["kind"] != "torch"  # numpy: raw bytes, decoded as the big ones are
                dtype = torch.uint8 if raw else torch_dtype(e["dtype"])
                spec = specs[e["dtype"]] = (dtype, raw, dtype.itemsize)
            dtype, raw, itemsize = spec
            # The batch lies in the buffer at the file's alignment: every tensor's byte offset
            # there is then a multiple of its item size (which divides ALIGN), as in the file.
            at = (offset + base) // itemsize
            count = (stop - offset) // itemsize
            if spec is not run_spec and (run_spec is None or run_spec[:2] != spec[:2]):
                run.end = run_end
                run = Run(dtype, raw, at, at)
                runs.append(run)
                sizes, index, shapes, run_spec = run.sizes, run.index, run.shapes, spec
            elif at > run_end:  # the padding before it, a piece of its own
                sizes.append(at - run_end)
                index.append(-1)
                shapes.append(None)
            shape = e["shape"]
            sizes.append(count)
            index.append(i)
            shapes.append(None if raw or (len(shape) == 1 and shape[0] == count) else shape)
            run_end = at + count
        run.end = run_end
        return runs
