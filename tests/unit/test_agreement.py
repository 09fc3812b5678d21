"""When the ranks agree, from tables: the interval from the measured pace, and which safe
points agree (the same on every rank)."""

from __future__ import annotations

import pytest

from ferry.session.agreement import Pace, StepClock, agrees, interval

# (case, cost of one agreement s, step s, steps between agreements); overhead 0.5 %, wait <= 0.5 s
INTERVALS = [
    ("nothing measured yet: every step", None, None, 1),
    ("the cost only: every step", 100e-6, None, 1),
    ("the step only: every step", None, 0.005, 1),
    ("100 us against 5 ms steps: 0.5 % needs 4", 100e-6, 0.005, 4),
    ("100 us against 20 ms steps", 100e-6, 0.020, 1),
    ("100 us against 100 ms steps", 100e-6, 0.100, 1),
    ("1 ms (thousands of ranks) against 5 ms steps", 1e-3, 0.005, 40),
    ("50 ms against 5 ms steps: the signal's wait caps it at 0.5 s", 50e-3, 0.005, 100),
    ("steps longer than the wait: every step", 50e-3, 2.0, 1),
    ("a zero step time (a clock that did not move): every step", 100e-6, 0.0, 1),
]


@pytest.mark.parametrize(("case", "cost", "step", "steps"), INTERVALS, ids=[r[0] for r in INTERVALS])
def test_interval(case: str, cost: float | None, step: float | None, steps: int) -> None:
    assert interval(Pace(cost=cost, step=step), overhead=0.005, latency=0.5) == steps


def test_the_interval_keeps_the_overhead_within_its_share() -> None:
    for cost in (20e-6, 80e-6, 300e-6, 2e-3):
        for step in (0.001, 0.005, 0.020, 0.100):
            n = interval(Pace(cost=cost, step=step), overhead=0.005, latency=10.0)
            assert cost / (n * step) <= 0.005 or (n == 1 and cost / step <= 0.005)


# (case, step, every_steps, last saved step, the step of the next agreement, agree?)
POINTS: list[tuple[str, int, int | None, int, int, bool]] = [
    ("before the scheduled step: no", 7, None, -1, 8, False),
    ("at the scheduled step", 8, None, -1, 8, True),
    ("past it (a safe point that did not count a step)", 9, None, -1, 8, True),
    ("a checkpoint due by steps agrees off the schedule", 10, 5, -1, 14, True),
    ("not due by steps", 11, 5, -1, 14, False),
    ("due by steps but just saved (or restored)", 10, 5, 10, 14, False),
    ("step 0 is never due", 0, 5, -1, 14, False),
]


@pytest.mark.parametrize(
    ("case", "step", "every", "saved", "next_step", "agree"), POINTS, ids=[r[0] for r in POINTS]
)
def test_agrees(case: str, step: int, every: int | None, saved: int, next_step: int, agree: bool) -> None:
    assert agrees(step, next_step, every_steps=every, last_saved_step=saved) is agree


# (case, safe points as (step, time s), the step length the rank agrees on)
CLOCKS = [
    ("one safe point a step", [(1, 0.0), (2, 0.05), (3, 0.10), (4, 0.15)], 0.05),
    # zero-code: the loader's next() and the optimizer's step are both safe points of a step;
    # counted per safe point, the 1 ms between them would pass for the step (the CI failure)
    (
        "two safe points a step",
        [(1, 0.0), (1, 0.049), (2, 0.05), (2, 0.099), (3, 0.10), (3, 0.149), (4, 0.15)],
        0.05,
    ),
    ("a pause is one long step of many", [(1, 0.0), (2, 0.05), (3, 5.0), (4, 5.05), (5, 5.1)], 0.05),
    ("steps skipped between safe points are shared out", [(1, 0.0), (5, 0.2), (6, 0.25)], 0.05),
    ("no step yet", [(7, 0.0), (7, 0.3)], None),
]


@pytest.mark.parametrize(("case", "points", "step"), CLOCKS, ids=[r[0] for r in CLOCKS])
def test_step_clock(case: str, points: list[tuple[int, float]], step: float | None) -> None:
    clock = StepClock()
    for s, t in points:
        clock.tick(s, t)
    assert clock.take() == pytest.approx(step)
    assert clock.take() is None  # taken: the next agreement measures afresh


def test_step_clock_leaves_out_agreements_and_saves() -> None:
    clock = StepClock()
    clock.tick(1, 0.0)
    clock.restart(1, 2.0)  # an agreement of 2 s at step 1
    clock.tick(2, 2.05)
    clock.forget()  # a save at step 2
    clock.tick(2, 9.0)
    clock.tick(3, 9.05)
    assert clock.take() == pytest.approx(0.05)
