"""A ``range`` loop's position, counted by the items it has left.

CPython 3.11 tells a range iterator's index through ``__reduce__`` and sets it with an
absolute ``__setstate__(index)``; 3.12 and later give the rest of the range instead (the
index slot is ``None``) and their ``__setstate__(n)`` skips ``n`` items from where the
iterator is. The count of items left reads the same everywhere (``__length_hint__``), and a
resumed loop over the same range reaches the saved position by skipping its own count less
the saved one. Torch-free and ferry-free, so that it can be checked under any Python.
"""

from __future__ import annotations

import operator
from typing import Any

KINDS = frozenset({"range_iterator", "longrange_iterator"})


def _skips_from_here() -> bool:
    """Whether ``__setstate__(n)`` skips ``n`` items (3.12+) rather than going to index ``n``."""
    it: Any = iter(range(3))
    next(it)
    it.__setstate__(1)
    return bool(next(it) == 2)


SKIPS = _skips_from_here()


def left(it: Any) -> int:
    """How many items the range iterator ``it`` has yet to give."""
    return operator.length_hint(it)


def set_left(it: Any, count: int) -> None:
    """Move ``it`` forward until it has ``count`` items left (at most as many as it has)."""
    skip = left(it) - count
    if skip < 0:
        raise ValueError(f"a range iterator with {left(it)} items left cannot go back to {count}")
    it.__setstate__(skip if SKIPS else it.__reduce__()[2] + skip)
