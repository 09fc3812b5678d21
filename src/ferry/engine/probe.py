"""What a snapshot notes of each tensor it defers (``overlap_snapshot``), to check the copy
once it is done: its version counter, and a few of its words, read three times.

A version counter sees every in-place torch op on a tensor and on its views, but not a
write that goes around it: through ``.data`` (a new tensor with a counter of its own), a
NumPy or DLPack view, raw memory. So ``PROBE_WORDS`` words of each deferred tensor, at
positions drawn afresh for each snapshot (from the operating system's entropy, never the
script's random streams), are read

1. at the safe point (a GPU tensor's on its current stream, in order with the work queued
   before the safe point and before anything queued after it);
2. in the copy, once it is done;
3. from the tensor again, after its copy (a GPU tensor's on the side stream, after the
   copies; a host tensor's once the copy threads are done).

A copy that differs from 1 at a probed word holds that word from after the safe point; a
tensor that differs from its copy at a probed word was written meanwhile. Either refuses
the checkpoint. A copy that differs from the safe point in a fraction ``f`` of its words
passes with probability at most ``(1 - f) ** PROBE_WORDS``; a write that changed a fraction
``g`` of a tensor's words before the third read, whenever it came, at most
``(1 - g) ** PROBE_WORDS``, whatever part of the copy it reached. A word is 8 bytes where
the tensor's size and address allow, else 4, 2 or 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

PROBE_WORDS = 64
"""Words probed per deferred tensor: a write to half of a tensor's words escapes with
probability 2**-64; the reads cost microseconds a tensor."""

_NP: dict[int, np.dtype[np.integer]] = {
    8: np.dtype(np.int64),
    4: np.dtype(np.int32),
    2: np.dtype(np.int16),
    1: np.dtype(np.uint8),
}
_TORCH = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
_rng = np.random.default_rng()  # seeded from the OS: no random stream of the script's is used
_NOWHERE = np.zeros(0, dtype=np.int64)


def word_size(t: torch.Tensor) -> int:
    """The widest word (8, 4, 2 or 1 bytes) that divides ``t``'s size and its offset in its
    storage (viewing a GPU tensor as wider words needs both)."""
    offset = t.storage_offset() * t.element_size()
    return next(w for w in (8, 4, 2, 1) if t.nbytes % w == 0 and offset % w == 0)


class _Tensor:
    """One deferred tensor: what names it (its ``str``), the tensor, its copy (as words),
    its version at the safe point, its word size; a host tensor's own words (a view), a GPU
    tensor's place in its ``_Reads`` (bytes)."""

    __slots__ = ("copy", "name", "slot", "src", "version", "word", "words")

    def __init__(self, name: object, src: torch.Tensor, copy: np.ndarray, word: int) -> None:
        self.name, self.src, self.copy, self.word = name, src, copy, word
        self.version = src._version
        self.words = _NOWHERE
        self.slot = 0


@dataclass
class _Reads:
    """One GPU's probed words: the positions, and each read's words in pinned host memory."""

    tensors: list[_Tensor]
    at: torch.Tensor
    reads: list[torch.Tensor]


class Probe:
    """The deferred tensors of one snapshot, and their probed words. Calls, in order, on the
    training thread: ``host`` or ``cuda`` for each tensor, ``first`` (the safe point's reads,
    before any copy is queued), ``again_cuda`` on each GPU's side stream after its copies;
    then, once the copies are done, from one thread at a time: ``again_host``, ``changed``.

    The reads are kept as one row of ``PROBE_WORDS`` words (as int64) per tensor, host
    tensors first: one comparison of three matrices checks them all."""

    def __init__(self) -> None:
        self._host: list[_Tensor] = []
        self._cuda: dict[torch.device, list[_Tensor]] = {}
        self._reads: dict[torch.device, _Reads] = {}
        self._at = self._first = self._again = _NOWHERE

    def host(self, name: object, src: torch.Tensor, src_bytes: np.ndarray, dst_bytes: np.ndarray) -> None:
        """``src``, a contiguous host tensor whose bytes are ``src_bytes``, is copied into
        ``dst_bytes`` after the safe point."""
        word = 8 if src_bytes.size % 8 == 0 else next(w for w in (4, 2, 1) if src_bytes.size % w == 0)
        t = _Tensor(name, src, dst_bytes.view(_NP[word]), word)  # numpy views need no alignment
        t.words = src_bytes.view(_NP[word])
        self._host.append(t)

    def cuda(self, name: object, src: torch.Tensor, dst: torch.Tensor) -> None:
        """``src``, a contiguous GPU tensor, is copied into ``dst`` (host bytes) after the safe point."""
        word = word_size(src)
        self._cuda.setdefault(src.device, []).append(_Tensor(name, src, dst.numpy().view(_NP[word]), word))

    def first(self) -> None:
        """The safe point's reads: host tensors' now, each GPU's queued on its current stream."""
        tensors = self._all()
        sizes = np.array([t.copy.size for t in tensors], dtype=np.int64)
        self._at = (_rng.random((len(tensors), PROBE_WORDS)) * sizes[:, None]).astype(np.int64)
        self._first = np.empty_like(self._at)
        self._again = np.empty_like(self._at)
        self._read_host(self._first)
        row = len(self._host)
        for device, ts in self._cuda.items():
            slot = 0
            for t in ts:
                t.slot, slot = slot, slot + PROBE_WORDS * t.word
            where = torch.from_numpy(self._at[row : row + len(ts)]).pin_memory()
            reads = self._reads[device] = _Reads(ts, where.to(device, non_blocking=True), [])
            reads.reads.append(_gather(reads))
            row += len(ts)

    def again_cuda(self, device: torch.device, stream: torch.cuda.Stream) -> None:
        """The third read of ``device``'s tensors, queued on ``stream`` after their copies."""
        reads = self._reads[device]
        reads.at.record_stream(stream)  # made on the current stream, read on this one too
        reads.reads.append(_gather(reads))

    def again_host(self) -> None:
        """The third read of the host tensors, once their copies are done."""
        self._read_host(self._again)

    def changed(self) -> tuple[object, str] | None:
        """Once every copy and read is done: a tensor whose copy is not the safe point's
        (what names it, and how it was changed: ``in place`` or ``behind torch's back``)."""
        tensors = self._all()
        for t in tensors:
            if t.src._version != t.version:
                return t.name, "in place"
        self._gpu_rows()
        copied = np.empty_like(self._at)
        for i, (t, at) in enumerate(zip(tensors, self._at, strict=True)):
            copied[i] = t.copy[at]
        bad = np.flatnonzero(~((copied == self._first) & (copied == self._again)).all(axis=1))
        return None if bad.size == 0 else (tensors[bad[0]].name, "behind torch's back")

    def _all(self) -> list[_Tensor]:
        return self._host + [t for ts in self._cuda.values() for t in ts]

    def _read_host(self, into: np.ndarray) -> None:
        for i, (t, at) in enumerate(zip(self._host, self._at, strict=False)):
            into[i] = t.words[at]

    def _gpu_rows(self) -> None:
        """The GPUs' first and third reads, from pinned memory into their rows."""
        row = len(self._host)
        for reads in self._reads.values():
            for t in reads.tensors:
                for into, read in zip((self._first, self._again), reads.reads, strict=True):
                    into[row] = read.numpy()[t.slot : t.slot + PROBE_WORDS * t.word].view(_NP[t.word])
                row += 1


def _gather(reads: _Reads) -> torch.Tensor:
    """The probed words of one GPU's tensors, queued on the current stream, landing in pinned
    host memory (one copy)."""
    parts = [
        t.src.detach().reshape(-1).view(torch.uint8).view(_TORCH[t.word]).index_select(0, reads.at[i])
        for i, t in enumerate(reads.tensors)
    ]
    words = torch.cat([p.view(torch.uint8) for p in parts])
    host = torch.empty(words.numel(), dtype=torch.uint8, pin_memory=True)
    host.copy_(words, non_blocking=True)
    return host
