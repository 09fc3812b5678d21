"""How the training loader's batches feed optimizer steps (state/feeding.py), from tables:
each case is a sequence of events of one pass, ``f`` a batch handed out, ``s`` an
optimizer step, ``r`` a request for the next batch (where the held count and the safety
are read)."""

from __future__ import annotations

import pytest

from ferry.state.feeding import Feeding


def play(events: str, feeding: Feeding | None = None, site: str = "train") -> list[tuple[int, bool]]:
    """(held, safe) at each ``r``; ``|`` starts a new pass."""
    feeding = feeding or Feeding()
    handed, seen = 0, []
    for e in events.replace(" ", ""):
        if handed == 0 and feeding.site is None:
            feeding.site = (site, 1)
        if e == "f":
            handed += 1
        elif e == "s":
            feeding.step(handed)
        elif e == "r":
            seen.append((feeding.held(handed), feeding.safe(handed)))
        elif e == "|":
            feeding.new_pass()
            handed = 0
    return seen


@pytest.mark.parametrize(
    ("case", "events", "expected"),
    [
        # a plain loop: request, batch, step, request...
        ("plain", "r f s r f s r f s r", [(0, True), (0, True), (0, True), (0, True)]),
        # a wrapper holding one batch ahead (timm's PrefetchLoader): unknown until two steps
        ("prefetch-1", "r f r f s r f s r f s r", [(0, True), (0, True), (0, False), (1, True), (1, True)]),
        # two batches per step (gradient accumulation): the first one is in the gradients
        ("accumulate-2", "r f r f s r f r f s r", [(0, True), (0, True), (0, False), (0, False), (0, True)]),
        # both
        (
            "accumulate-2-prefetch-1",
            "r f r f r f s r f r f s r f",
            [(0, True)] * 3 + [(0, False), (0, False), (1, True)],
        ),
        # two optimizers stepping on each batch (a GAN) count as one step
        ("two-optimizers", "r f s s r f s s r f s s r", [(0, True), (0, True), (0, True), (0, True)]),
    ],
)
def test_held_batches_and_safe_requests(case: str, events: str, expected: list[tuple[int, bool]]) -> None:
    assert play(events) == expected


def test_a_pass_that_trains_nothing_has_no_safe_point_and_is_said_so() -> None:
    """An evaluation over the training loader between two training passes."""
    feeding = Feeding()
    play("r f s r f s r", feeding)  # a training pass: learned P = 0
    feeding.new_pass()
    seen = play("r f r f r f r", feeding, site="evaluate")
    assert seen == [(0, False)] * 4
    assert feeding.trained_nothing()
    feeding.new_pass()  # the next training pass: its first request is the previous one's end
    assert play("r f s r", feeding) == [(0, True), (0, True)]


def test_what_was_learned_travels_with_the_checkpoint() -> None:
    feeding = Feeding()
    play("r f r f s r f s r", feeding)
    saved = feeding.state()
    assert saved == {"ahead": 1, "per_step": 1}
    resumed = Feeding()
    resumed.resumed(5, saved)
    resumed.step(6)  # the wrapper holds batch 5 when batch 4 trains
    assert resumed.held(6) == 1 and resumed.safe(6)


@pytest.mark.parametrize("saved", [None, {}, {"ahead": -1, "per_step": 0}, {"ahead": "1", "per_step": 2**80}])
def test_a_crafted_or_missing_record_is_learned_again(saved: object) -> None:
    resumed = Feeding()
    resumed.resumed(3, saved)
    assert resumed.ahead is None and resumed.per_step is None
    resumed.step(4)
    assert resumed.ahead == 0  # one batch before the first step: nothing is held


def test_before_any_optimizer_step_every_request_is_safe() -> None:
    """A loop without a torch optimizer (manual SGD) keeps its safe points."""
    assert play("r f r f r f r") == [(0, True)] * 4
