"""The training loop's frames: reading for-loop iterators off the value stack, and a
capture in one run of a loop restored into another run of the same loop (in process)."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import torch

from ferry.autotrack import frames, stack

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = pytest.mark.skipif(
    not stack.supported(), reason="frame stacks readable on CPython 3.11-3.13 only"
)


def _caller_loops() -> dict[int, Any]:
    found = stack.loop_iterators(sys._getframe(1))
    assert found is not None
    return found


def test_the_iterators_of_the_loops_a_frame_is_inside_are_found_outermost_first() -> None:
    seen: list[list[str]] = []
    for _i, _j in enumerate(range(0, 10, 3)):
        for _k in [1, 2]:
            with open(os.devnull) as _f:  # its __exit__ is on the stack too: not a loop
                seen.append([type(v).__name__ for v in _caller_loops().values()])
            break
        break
    seen.append([type(v).__name__ for v in _caller_loops().values()])  # after the loops: none
    assert seen == [["enumerate", "tuple_iterator"], []]  # a literal list in a for is a tuple


def test_an_enumerate_count_is_set_and_read_back() -> None:
    it = enumerate("abc")
    assert stack.set_enumerate_count(it, 40)
    assert next(it) == (40, "a")


def _loop(n: int, stop_at: list[int], saved: dict[str, Any], log: list[Any]) -> None:
    """A training loop in miniature: counters, a carried tensor, an object's attribute."""

    class Counter:
        pass

    state = Counter()
    state.best = 0.0  # type: ignore[attr-defined]
    hidden = torch.zeros(2)
    total = 0
    for epoch in range(n):
        for i, x in enumerate([10, 20, 30]):
            if "frames" in saved and "done" not in saved:  # the restore point of the resumed run
                here = frames.loop_frames(sys._getframe(), HERE)
                assert frames.mismatch(saved["frames"], here) is None
                _, failed = frames.restore(saved["frames"], here)
                assert failed == []
                saved["done"] = True  # epoch, i, x, total, hidden, state.best are the saved ones now
            if epoch * 3 + i in stop_at:  # a list: plain locals (an int argument too) are restored
                got = frames.capture(sys._getframe(), set(), HERE)
                saved["frames"] = got.frames
                return
            total += x
            hidden = hidden + x
            state.best = max(state.best, total / 7)  # type: ignore[attr-defined]
            log.append((epoch, i, x, total, hidden.tolist(), state.best))  # type: ignore[attr-defined]


def test_a_loop_captured_in_one_run_continues_in_another() -> None:
    plain: list[Any] = []
    _loop(3, [], {}, plain)
    first: list[Any] = []
    saved: dict[str, Any] = {}
    _loop(3, [4], saved, first)
    second: list[Any] = []
    _loop(3, [], saved, second)
    assert first + second == plain


def test_frames_that_do_not_match_are_refused() -> None:
    saved: dict[str, Any] = {}
    _loop(2, [1], saved, [])
    here = frames.loop_frames(sys._getframe(), HERE)
    assert "was saved where" in (frames.mismatch(saved["frames"][-1:], here[-1:]) or "")
    assert "frames of the script" in (frames.mismatch(saved["frames"], here[:1] * 5) or "")
