"""A ``range`` loop's position, kept as the next value it gives.

CPython 3.11 tells a range iterator's index through ``__reduce__`` and sets it with an
absolute ``__setstate__(index)``; 3.12 and later give the rest of the range instead (the
index slot is ``None``) and their ``__setstate__(n)`` skips ``n`` items from where the
iterator is. The next value reads the same on both (the rest of the range starts there;
on 3.11, the range at the index), and it means what the script means: a resumed
``for epoch in range(args.epochs)`` run with more epochs goes on at the epoch after the
checkpoint's, as an index did. Torch-free and ferry-free, so that it is checked under any
Python.
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


def _rest(it: Any) -> tuple[range, int]:
    """The range ``it`` walks and the index of its next item in that range."""
    reduced = it.__reduce__()
    walked: range = reduced[1][0] if reduced[1] else range(0)
    return (walked, 0) if SKIPS else (walked, int(reduced[2]))


def next_value(it: Any) -> int:
    """The value the range iterator ``it`` gives next (one step past its last, when done)."""
    walked, index = _rest(it)
    return walked.start + index * walked.step


def _plan(it: Any, value: int) -> tuple[int, str | None]:
    """The ``__setstate__`` argument that makes ``value`` the next of ``it``; or why none does
    (behind it, off its steps, beyond its end)."""
    walked, index = _rest(it)
    here, step = walked.start + index * walked.step, walked.step
    skip, off = divmod(value - here, step)
    if off or skip < 0 or skip > operator.length_hint(it):
        return 0, f"its next value {value} is not ahead in the range it iterates now ({here} next, by {step})"
    return (skip if SKIPS else index + skip), None


def why_not(it: Any, value: int) -> str | None:
    """Why ``skip_to(it, value)`` cannot be done; None if it can."""
    return _plan(it, value)[1]


def skip_to(it: Any, value: int) -> None:
    """Move ``it`` forward until ``value`` is the next it gives (its end, when ``value`` is one
    step past its last); ``why_not`` first."""
    state, why = _plan(it, value)
    if why is not None:
        raise ValueError(why)
    it.__setstate__(state)
