"""What the session does at a safe point, from a table: one row a case to check by eye."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

import pytest

from ferry.session.policy import (
    Asked,
    SafePoint,
    SafePointAction,
    asked_at,
    decide_at_safe_point,
    due,
    idle,
    stop_exit_code,
)

NOTHING, SAVE, STOP = SafePointAction.NOTHING, SafePointAction.SAVE, SafePointAction.STOP
TERM, USR1 = int(signal.SIGTERM), int(signal.SIGUSR1)


@dataclass(frozen=True)
class Row:
    name: str
    action: SafePointAction
    why: str
    point: dict[str, Any] = field(default_factory=dict)
    """SafePoint fields other than the defaults below."""
    others: Asked = field(default_factory=Asked)
    """What the other ranks wished (nothing, with one process)."""
    stopping: bool = False
    restore_pending: bool = False


# now=100.0 throughout; the last save (or the start) at t=0, step -1 unless a row says otherwise
ROWS = [
    Row("nothing configured, nothing asked", NOTHING, "nothing due", {"step": 7}),
    Row("step 0 never saves periodically", NOTHING, "nothing due", {"step": 0, "every_steps": 5}),
    Row("every 5 steps: step 10 saves", SAVE, "due", {"step": 10, "every_steps": 5}),
    Row("every 5 steps: step 11 does not", NOTHING, "nothing due", {"step": 11, "every_steps": 5}),
    Row(
        "step 10 already saved (or restored) is not saved again",
        NOTHING,
        "nothing due",
        {"step": 10, "every_steps": 5, "last_saved_step": 10},
    ),
    Row("every 60 s, 100 s since the last save", SAVE, "due", {"step": 3, "every_seconds": 60.0}),
    Row(
        "every 60 s, 40 s since the last save",
        NOTHING,
        "nothing due",
        {"step": 3, "every_seconds": 60.0, "last_saved_time": 60.0},
    ),
    Row(
        "every 60 s, exactly 60 s since",
        SAVE,
        "due",
        {"step": 3, "every_seconds": 60.0, "last_saved_time": 40.0},
    ),
    Row(
        "the seconds are due, but this step was just saved",
        NOTHING,
        "nothing due",
        {"step": 3, "every_seconds": 60.0, "last_saved_step": 3},
    ),
    Row("a checkpoint signal saves", SAVE, "a checkpoint signal", {"step": 4, "checkpoint_signal": True}),
    Row(
        "a checkpoint signal saves a step already saved",
        SAVE,
        "a checkpoint signal",
        {"step": 4, "checkpoint_signal": True, "last_saved_step": 4},
    ),
    Row("a checkpoint request saves", SAVE, "a checkpoint request", {"step": 4, "requests": ("checkpoint",)}),
    Row(
        "a checkpoint request at step 0",
        SAVE,
        "a checkpoint request",
        {"step": 0, "requests": ("checkpoint",)},
    ),
    Row(
        "a request while a save is in flight waits for the next safe point after it",
        NOTHING,
        "a save in flight: the save asked for waits for it",
        {"step": 4, "requests": ("checkpoint",), "saving": True},
    ),
    Row(
        "so does a checkpoint signal",
        NOTHING,
        "a save in flight: the save asked for waits for it",
        {"step": 4, "checkpoint_signal": True, "saving": True},
    ),
    Row(
        "a periodic save does not wait: due at this step only",
        SAVE,
        "a checkpoint request",
        {"step": 10, "every_steps": 5, "requests": ("checkpoint",), "saving": True},
    ),
    Row(
        "a request 0.5 s after a save that blocked 0.1 s waits: asked saves take <= 5% of training",
        NOTHING,
        "saves asked for take at most their share of training",
        {"step": 4, "requests": ("checkpoint",), "last_saved_time": 99.5, "last_blocked": 0.1},
    ),
    Row(
        "2 s after it, the request saves",
        SAVE,
        "a checkpoint request",
        {"step": 4, "requests": ("checkpoint",), "last_saved_time": 98.0, "last_blocked": 0.1},
    ),
    Row(
        "held back 1 s at most, whatever the last save blocked",
        SAVE,
        "a checkpoint request",
        {"step": 4, "requests": ("checkpoint",), "last_saved_time": 98.9, "last_blocked": 3.0},
    ),
    Row(
        "a periodic save is not held back by the share",
        SAVE,
        "due",
        {"step": 10, "every_steps": 5, "last_saved_time": 99.9, "last_blocked": 0.1},
    ),
    Row(
        "nor is a stop",
        STOP,
        "a stop request",
        {"step": 4, "requests": ("stop",), "last_saved_time": 99.9, "last_blocked": 0.1},
    ),
    Row("a stop signal stops", STOP, "SIGTERM", {"step": 4, "stop_signal": TERM}),
    Row(
        "a stop does not wait for the save in flight",
        STOP,
        "a stop request",
        {"step": 4, "requests": ("checkpoint", "stop"), "saving": True},
    ),
    Row("SIGUSR1 as a stop signal", STOP, "SIGUSR1", {"step": 4, "stop_signal": USR1}),
    Row(
        "a stop beats a periodic save of the same step",
        STOP,
        "SIGTERM",
        {"step": 10, "every_steps": 5, "stop_signal": TERM},
    ),
    Row("a stop request stops", STOP, "a stop request", {"step": 4, "requests": ("stop",)}),
    Row("a restart request stops", STOP, "a stop request", {"step": 4, "requests": ("restart",)}),
    Row(
        "a stop among checkpoint requests stops",
        STOP,
        "a stop request",
        {"step": 4, "requests": ("checkpoint", "stop")},
    ),
    Row(
        "the signal names the stop, over a request",
        STOP,
        "SIGTERM",
        {"step": 4, "stop_signal": TERM, "requests": ("stop",)},
    ),
    Row(
        "another rank's stop stops this one",
        STOP,
        "a stop asked of another rank",
        {"step": 4},
        Asked(stop=True),
    ),
    Row(
        "another rank's stop, while a checkpoint was asked here",
        STOP,
        "a stop request",
        {"step": 4, "requests": ("checkpoint",)},
        Asked(stop=True),
    ),
    Row(
        "another rank's checkpoint saves this one too",
        SAVE,
        "a checkpoint asked of another rank",
        {"step": 4},
        Asked(save=True),
    ),
    Row(
        "already stopping: nothing, even on a signal",
        NOTHING,
        "already stopping",
        {"step": 4, "stop_signal": TERM},
        stopping=True,
    ),
    Row(
        "before the restore point: nothing, even when due",
        NOTHING,
        "the checkpoint is restored at the first batch; nothing is saved before",
        {"step": 10, "every_steps": 5, "requests": ("checkpoint",)},
        restore_pending=True,
    ),
]


def outcome(row: Row) -> tuple[SafePointAction, str]:
    """A safe point as the session goes through it, with the ranks' agreement a union."""
    why = idle(stopping=row.stopping, restore_pending=row.restore_pending)
    if why is not None:
        return NOTHING, why
    point = SafePoint(**{"now": 100.0, "last_saved_step": -1, "last_saved_time": 0.0, **row.point})
    decision = decide_at_safe_point(point, asked_at(point) | row.others)
    return decision.action, decision.why


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_safe_point(row: Row) -> None:
    assert outcome(row) == (row.action, row.why)


def test_asked_at_is_what_this_rank_alone_is_asked() -> None:
    point = SafePoint(now=5.0, step=3, last_saved_step=-1, last_saved_time=0.0, requests=("restart",))
    assert asked_at(point) == Asked(stop=True, save=True)
    assert asked_at(SafePoint(now=5.0, step=3, last_saved_step=-1, last_saved_time=0.0)) == Asked()


def test_both_triggers_count_once_per_step() -> None:
    point = SafePoint(
        now=100.0, step=10, last_saved_step=10, last_saved_time=0.0, every_steps=5, every_seconds=1
    )
    assert not due(point)


# committed, exit_code, failure_exit_code, under_agent -> the process's exit status
EXITS = [
    ("committed: resume me", True, 85, 86, False, 85),
    ("committed, a configured code", True, 3, 86, False, 3),
    ("committed, a rank under torchrun's agent in ferry run: 0 (ferry run exits 85)", True, 85, 86, True, 0),
    ("the stop's checkpoint failed", False, 85, 86, False, 86),
    ("failed under the agent too: the agent must see it fail", False, 85, 86, True, 86),
    ("failed, a configured failure code", False, 85, 7, False, 7),
]


@pytest.mark.parametrize(
    ("name", "committed", "code", "failure", "under_agent", "expected"), EXITS, ids=[r[0] for r in EXITS]
)
def test_stop_exit_code(
    name: str, committed: bool, code: int, failure: int, under_agent: bool, expected: int
) -> None:
    assert (
        stop_exit_code(
            committed=committed, exit_code=code, failure_exit_code=failure, under_agent=under_agent
        )
        == expected
    )
