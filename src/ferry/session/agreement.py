"""At which safe points the ranks of a job agree, decided from plain values.

Agreeing (one small all-reduce, ``ferry.runtime.distributed.RankGroup.agree``) costs about
the same whatever the step: tens of microseconds on one host, about a millisecond across
many. At every safe point that is several percent of a 5 ms step, so the ranks agree only
at some safe points, the same ones on every rank:

- every ``interval(pace)`` steps, where ``pace`` is what the last agreement measured (the
  cost of an agreement, the most any rank saw; the time of a step, the least): so that agreeing
  costs at most ``knobs.AGREE_OVERHEAD`` of training time, and a signal waits for the next
  agreement at most ``knobs.AGREE_LATENCY_SECONDS`` (or one step, where a step is longer);
- at a step where a checkpoint is due by the step count, which is due on every rank alike
  and at that step only.

Between two agreements a rank's wishes wait: signals and requests stay recorded until a
save or a stop acts on them, a checkpoint due by time stays due, and all reach the other
ranks at the next agreement, where every rank decides on the same step. The schedule is a
function of values every rank holds alike (its step, the pace the last agreement returned,
its settings), so no rank ever waits in an agreement that another skips.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from ferry.knobs import AGREE_LATENCY_SECONDS, AGREE_OVERHEAD
from ferry.session.policy import due_at


@dataclass(frozen=True, kw_only=True)
class Pace:
    """What the last agreement measured, the same on every rank."""

    cost: float | None = None
    """Seconds one agreement takes (None: not measured yet)."""
    step: float | None = None
    """Seconds one training step takes: each rank's median step since the last agreement
    (``StepClock``: agreements, saves and pauses between steps left out), the least of the
    ranks' (None: not yet)."""


def interval(pace: Pace, *, overhead: float = AGREE_OVERHEAD, latency: float = AGREE_LATENCY_SECONDS) -> int:
    """Steps from one agreement to the next: 1 until both are measured; then as many as keep
    the agreement's share of the time at most ``overhead``, but no more than a wait of
    ``latency`` seconds for a signal, and at least 1."""
    if pace.cost is None or pace.step is None or pace.step <= 0:
        return 1
    by_cost = math.ceil(pace.cost / (overhead * pace.step))
    by_latency = math.floor(latency / pace.step)
    return max(1, min(by_cost, by_latency))


def agrees(step: int, next_agreement: int, *, every_steps: int | None, last_saved_step: int) -> bool:
    """Do the ranks agree at this safe point? Plain values: the session asks at every step."""
    return step >= next_agreement or due_at(step, every_steps=every_steps, last_saved_step=last_saved_step)


STEP_SAMPLES = 1024
"""The most step lengths a rank keeps between two agreements (the latest ones)."""


class StepClock:
    """A rank's step lengths since the last agreement, for the step time it agrees on.

    A step runs from the first safe point of one step to the first safe point of a later
    one (a step may pass several safe points: a loader's ``next()`` and an optimizer's
    step), per step. The median of these is the rank's step time, so that a pause between
    two steps (an evaluation, a hold) does not pass for slow steps, which would make the
    ranks agree more often than their cost allows; what is not a step (an agreement, a
    save) is left out by starting again after it (``restart``, ``forget``)."""

    def __init__(self) -> None:
        self._lengths: deque[float] = deque(maxlen=STEP_SAMPLES)
        self._mark: tuple[float, int] | None = None

    def tick(self, step: int, now: float) -> None:
        """A safe point of ``step`` at ``now`` (seconds)."""
        if self._mark is None:
            self._mark = (now, step)
        elif step > self._mark[1]:
            self._lengths.append((now - self._mark[0]) / (step - self._mark[1]))
            self._mark = (now, step)

    def take(self) -> float | None:
        """The median step length since the last take (None: no step yet); starts afresh."""
        median = statistics.median(self._lengths) if self._lengths else None
        self._lengths.clear()
        return median

    def restart(self, step: int, now: float) -> None:
        """Count the next step from ``now``, as of ``step`` (after an agreement)."""
        self._mark = (now, step)

    def forget(self) -> None:
        """Count from the next safe point on (after a save)."""
        self._mark = None
