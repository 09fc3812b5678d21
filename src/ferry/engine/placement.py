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
from typing import Any

import torch

from ferry.engine.snapshot import byte_view, tensor_bytes

CHUNK = 16 << 20
"""The largest piece read at once (and hashed while the next one is read)."""
DIRECT_MIN = 256 << 10
"""Tensors below this are read through the bounce buffers: not worth a read call each."""

Owner = tuple[torch.Tensor, int]
"""The host buffer a tensor's bytes ended in, and their offset there."""


class Bounce:
    """Two reused host buffers that batches of small tensors are read into, alternately:
    a piece is still being hashed while the next one is read, so two pieces in a row
    never share a buffer. Allocated on first use, at most ``CHUNK`` bytes each."""

    def __init__(self, size: int = CHUNK) -> None:
        self.size = size
        self._bufs: list[torch.Tensor] = []
        self._turn = 0

    def take(self, nbytes: int) -> torch.Tensor:
        assert 0 < nbytes <= self.size
        if len(self._bufs) < 2:
            self._bufs.append(torch.empty(self.size, dtype=torch.uint8))
        buf = self._bufs[self._turn % len(self._bufs)]
        self._turn += 1
        return buf[:nbytes]


@dataclass
class FilePlan:
    """The pieces one data file is read into, in file order, and the tensors they make.

    ``owners`` is complete once every piece has been read and ``filled`` called on it."""

    pieces: list[memoryview] = field(default_factory=list)
    owners: dict[int, Owner] = field(default_factory=dict)
    copy_outs: dict[int, tuple[torch.Tensor, list[tuple[int, int, int]]]] = field(default_factory=dict)
    """Piece index -> (its bounce slice, [(tensor index, offset in the slice, nbytes)])."""

    def filled(self, piece: int) -> None:
        """Piece ``piece`` has been read: copy its small tensors out, before the bounce
        buffer it lies in is read into again."""
        batch = self.copy_outs.pop(piece, None)
        if batch is None:
            return
        src, members = batch
        for i, at, n in members:
            self.owners[i] = (src[at : at + n].clone(), 0)


def _units(entries: list[dict[str, Any]], order: list[int]) -> list[list[int]]:
    """The tensors of ``order`` (sorted by offset, none empty) grouped by shared bytes.
    Ferry writes every tensor apart, so each group is then one tensor."""
    units: list[list[int]] = []
    end = 0
    for i in order:
        e = entries[i]
        if units and e["offset"] < end:
            units[-1].append(i)
        else:
            units.append([i])
        end = max(end, e["offset"] + e["nbytes"])
    return units


def plan_file(
    entries: list[dict[str, Any]], file: str, size: int, targets: dict[int, torch.Tensor], bounce: Bounce
) -> FilePlan:
    """Where each byte of ``file`` (``size`` bytes) goes; ``targets`` maps tensor indices to
    the live tensors their bytes are read straight into (never tensors that share bytes)."""
    plan = FilePlan()
    order = sorted(
        (i for i, e in enumerate(entries) if e["file"] == file and e["nbytes"]),
        key=lambda i: entries[i]["offset"],
    )
    for i, e in enumerate(entries):
        if e["file"] == file and not e["nbytes"]:
            plan.owners[i] = (torch.empty(0, dtype=torch.uint8), 0)
    pos = 0
    batch: list[int] = []
    batch_start = 0

    def skip_to(upto: int) -> None:
        nonlocal pos
        while pos < upto:  # fresh scratch each time: the previous piece may still be hashed
            n = min(CHUNK, upto - pos)
            plan.pieces.append(memoryview(bytearray(n)))
            pos += n

    def add(view: memoryview) -> None:
        plan.pieces.extend(view[at : at + CHUNK] for at in range(0, len(view), CHUNK))

    def flush() -> None:
        nonlocal pos
        if not batch:
            return
        end = entries[batch[-1]]["offset"] + entries[batch[-1]]["nbytes"]
        src = bounce.take(end - batch_start)
        members = [(i, entries[i]["offset"] - batch_start, entries[i]["nbytes"]) for i in batch]
        plan.copy_outs[len(plan.pieces)] = (src, members)
        plan.pieces.append(byte_view(src))
        pos = end
        batch.clear()

    for unit in _units(entries, order):
        start = entries[unit[0]]["offset"]
        end = max(entries[i]["offset"] + entries[i]["nbytes"] for i in unit)
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
