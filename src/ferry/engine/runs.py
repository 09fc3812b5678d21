"""Runs of small tensors, copied by one call each.

A state of many small tensors (an optimizer's per-parameter states: biases, norms, their
moments and step counters) spent most of a save's time on calls made once per tensor
from Python: asking each tensor where its bytes are and copying them, a few microseconds
each. The layout (``codec.layout``) places a small tensor right after a small one of its
dtype, so that a run of them is one block of the data file; ``copy_run`` fills that block
with one ``torch.cat`` (its C++ loop resolves strides and lazily negated or conjugated
views, as a copy does). A run holds 1-D tensors only (``cat`` takes no 0-D ones, and
viewing each tensor as 1-D from Python cost more than its copy by address).
"""

from __future__ import annotations

import torch

from ferry.engine.codec import TensorEntry, torch_dtype
from ferry.knobs import WRITE_BOUNCE_BYTES, WRITE_SMALL_BYTES

SMALL = WRITE_SMALL_BYTES
"""Tensors below this may be part of a run (codec.layout lays them out so)."""
LONGEST = WRITE_BOUNCE_BYTES
"""The most bytes one block holds: a run longer than this is copied as several blocks,
so that the memory each takes is small and reused from one block to the next."""

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def run_end(entries: list[TensorEntry], arrays: list[object], i: int) -> int:
    """The index after the last tensor of the run that starts at ``i``: the small 1-D host
    tensors of ``i``'s dtype that follow it in the data file with no gap, up to ``LONGEST``
    bytes. ``i + 1`` when there is none (or ``i`` is no plain small 1-D host tensor: a
    tensor subclass may keep its values elsewhere, a numpy array is copied its own way)."""
    first = entries[i]
    if first.nbytes >= SMALL or first.device != "cpu" or len(first.shape) != 1:
        return i + 1
    if type(arrays[i]) not in _PLAIN:
        return i + 1
    dtype, end = first.dtype, first.offset + first.nbytes
    limit = first.offset + LONGEST
    j, n = i + 1, len(entries)
    while j < n:
        e = entries[j]
        nbytes = e.nbytes
        stop = end + nbytes
        if e.offset != end or e.dtype != dtype or nbytes >= SMALL or stop > limit:
            break
        if e.device != "cpu" or len(e.shape) != 1 or type(arrays[j]) not in _PLAIN:
            break
        end = stop
        j += 1
    return j


def copy_run(tensors: list[torch.Tensor], into: torch.Tensor, dtype: str) -> None:
    """Copy the run ``tensors`` (1-D, of ``dtype``, in host memory) into the bytes ``into``
    (uint8, as long as the run), back to back."""
    with torch.no_grad():
        torch.cat(tensors, out=into.view(torch_dtype(dtype)))
