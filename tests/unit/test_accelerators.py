"""accelerate's gradient accumulation count (``Accelerator.step``) kept beside the loop's
frames (autotrack/accelerators.py): found under a local or an attribute of ``self`` of the
loop's frames, put back under the same frame and name, and a crafted record (it comes from a
checkpoint) is left out. The resumed run it makes exact: test_exact_accelerate.py."""

from __future__ import annotations

import sys

import pytest

from ferry.autotrack import accelerators

accelerate = pytest.importorskip("accelerate")


def _accelerator() -> object:
    return accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)


def test_a_local_count_comes_back_and_a_crafted_one_is_left_out() -> None:
    accelerator = _accelerator()
    accelerator.step = 1  # one batch of two accumulated
    saved = accelerators.capture(sys._getframe())
    assert list(saved.values()) == [1] and next(iter(saved)).endswith(":accelerator")
    accelerator.step = 0  # the resumed process's fresh Accelerator
    accelerators.restore(sys._getframe(), saved)
    assert accelerator.step == 1
    where = next(iter(saved))
    for crafted in (None, [1], {where: -1}, {where: "1"}, {where: True}, {where: 1 << 40}, {"elsewhere": 1}):
        accelerator.step = 0
        accelerators.restore(sys._getframe(), crafted)
        assert accelerator.step == 0, crafted


class Loop:
    def __init__(self) -> None:
        self.accelerator = _accelerator()

    def counts(self) -> dict[str, int]:
        return accelerators.capture(sys._getframe())


def test_an_accelerator_held_by_self_is_found() -> None:
    loop = Loop()
    loop.accelerator.step = 3  # type: ignore[attr-defined]
    assert [(k.rsplit(":", 1)[1], v) for k, v in loop.counts().items()] == [("self.accelerator", 3)]
