"""A range loop's position is kept as the next value it gives (autotrack/ranges.py), so that a
resumed ``for step in range(n)`` goes on where it stopped on every CPython: 3.12 and later no
longer tell a range iterator's index and their ``__setstate__`` skips from where it is (a
zero-code job of 3.12 crashed at its first safe point on ``int(None)`` before). A run resumed
with a longer range (more epochs) goes on after the checkpoint's epoch."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from otherpythons import other_pythons

from ferry.autotrack import ranges
from ferry.autotrack.frames import loop_state
from ferry.state.framestate import RANGE, LoopState

RANGES = [range(10), range(5, 50, 7), range(20, 0, -3), range(2**70, 2**70 + 10)]

CHECK = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("ranges", sys.argv[1])
ranges = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ranges)
for r in (range(10), range(5, 50, 7), range(20, 0, -3), range(2**70, 2**70 + 10)):
    for stop_at in range(len(r)):
        saved = iter(r)
        for _ in range(stop_at + 1):
            next(saved)
        resumed = iter(r)
        next(resumed)  # the resumed loop has taken its first item when it is positioned
        ranges.skip_to(resumed, ranges.next_value(saved))
        assert list(resumed) == list(saved), (r, stop_at)
done, longer = iter(range(3)), iter(range(5))
list(done)
next(longer)
ranges.skip_to(longer, ranges.next_value(done))
assert list(longer) == [3, 4]
print("ok", ranges.SKIPS)
"""


def _resume_at(r: range, stop_at: int) -> tuple[list[int], list[int]]:
    saved: Any = iter(r)
    for _ in range(stop_at + 1):
        next(saved)
    resumed: Any = iter(r)
    next(resumed)
    ranges.skip_to(resumed, ranges.next_value(saved))
    return list(resumed), list(saved)


@pytest.mark.parametrize("r", RANGES, ids=str)
def test_a_resumed_range_goes_on_after_the_item_it_stopped_at(r: range) -> None:
    for stop_at in range(len(r)):
        got, want = _resume_at(r, stop_at)
        assert got == want


def test_a_range_is_captured_by_its_next_value_and_never_moved_back() -> None:
    it: Any = iter(range(100))
    for _ in range(30):
        next(it)
    assert loop_state(it) == LoopState(RANGE, 30)
    assert ranges.why_not(it, 29) is not None and ranges.why_not(it, 101) is not None
    with pytest.raises(ValueError, match="not ahead"):
        ranges.skip_to(it, 29)


def test_a_run_resumed_with_more_epochs_goes_on_after_the_checkpoints_epoch() -> None:
    done: Any = iter(range(3))  # the checkpoint at the end of the last of 3 epochs
    for _ in done:
        pass
    longer: Any = iter(range(5))  # resumed with --epochs 5, at its first epoch
    next(longer)
    ranges.skip_to(longer, ranges.next_value(done))
    assert list(longer) == [3, 4]


def test_the_same_holds_under_every_other_cpython_on_this_machine() -> None:
    pythons = list(other_pythons().values())
    if not pythons:
        pytest.skip("no other CPython 3.11-3.13 on this machine to check autotrack/ranges.py under")
    source = str(Path(ranges.__file__))
    for python in pythons:
        out = subprocess.run([python, "-c", CHECK, source], capture_output=True, text=True, check=False)
        assert out.returncode == 0 and out.stdout.startswith("ok"), (python, out.stdout, out.stderr)
