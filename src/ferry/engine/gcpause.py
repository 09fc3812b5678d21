"""Pause Python's cyclic garbage collector while a save or load handles many tensors.

A checkpoint of N tensors makes several containers per tensor (the skeleton's nodes, the
manifest's entries, the tensors themselves), none of them part of a cycle. Every few
hundred of them the collector runs, and every so often a full pass walks every object of
the process (torch alone holds hundreds of thousands): with 20,000 tensors those passes
took as long as all the rest of a load. Paused, the objects are freed by reference counts
as usual; garbage cycles made meanwhile (by other threads) wait for the next collection.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """No automatic collection inside the block. It turns the collector back on only if it
    was on when the block began: nested or concurrent blocks, and a caller who keeps it off,
    are left as they were (a block that overlaps another may end with it on: harmless)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
