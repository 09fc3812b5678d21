"""What to do at a safe point, decided from plain values; the session does the I/O around it.

A safe point goes through three steps, with the ranks' agreement in between::

    idle(...)                            -> why nothing at all happens here (no polling, no
                                            agreement), or None
    asked_at(point)                      -> what this rank would like: stop? save?
    decide_at_safe_point(point, agreed)  -> what every rank does, given the union of all
                                            ranks' wishes

A stop then ends the process with ``stop_exit_code``.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass

from ferry.knobs import ASKED_SAVE_HOLD_SECONDS, ASKED_SAVE_SHARE


class SafePointAction(enum.Enum):
    NOTHING = "nothing"
    SAVE = "save"
    STOP = "stop"
    """Save a checkpoint, then exit with the configured exit code."""


@dataclass(frozen=True, kw_only=True)
class SafePoint:
    """What the session knows at a safe point."""

    now: float
    """time.monotonic() at this safe point."""
    step: int
    """Steps done so far."""
    last_saved_step: int
    """The step of the last save or restore (-1 before either)."""
    last_saved_time: float
    """When the last save began (the session's start before any)."""
    every_steps: int | None = None
    every_seconds: float | None = None
    stop_signal: int | None = None
    """The number of a stop signal received, if any."""
    checkpoint_signal: bool = False
    """A checkpoint signal was received since the last save."""
    requests: tuple[str, ...] = ()
    """The actions of the control requests waiting: "checkpoint", "stop" or "restart"."""
    saving: bool = False
    """The previous save is still being written (one process; ranks never wait so, since
    they must all save the same steps)."""
    last_blocked: float = 0.0
    """Seconds the last save blocked training (one process; 0 for ranks, as ``saving``)."""


@dataclass(frozen=True)
class Asked:
    stop: bool = False
    save: bool = False

    def __or__(self, other: Asked) -> Asked:
        return Asked(self.stop or other.stop, self.save or other.save)


@dataclass(frozen=True)
class SafePointDecision:
    action: SafePointAction
    why: str
    """For a stop, the words of its log line ("SIGTERM", "a stop request", ...)."""


def idle(*, stopping: bool, restore_pending: bool) -> str | None:
    """Why a safe point does nothing at all, or None. Every rank is idle alike: a stop ends
    them all, and the restore point is the same batch on each."""
    if stopping:
        return "already stopping"
    if restore_pending:
        return "the checkpoint is restored at the first batch; nothing is saved before"
    return None


def due(point: SafePoint) -> bool:
    """Is a periodic checkpoint due? Never at step 0, never twice for one step."""
    by_time = point.every_seconds is not None and point.now - point.last_saved_time >= point.every_seconds
    return (due_by_steps(point) or by_time) and point.step != point.last_saved_step


def due_by_steps(point: SafePoint) -> bool:
    """Is a checkpoint due by the step count? (``due_at`` of the point's values.)"""
    return due_at(point.step, every_steps=point.every_steps, last_saved_step=point.last_saved_step)


def due_at(step: int, *, every_steps: int | None, last_saved_step: int) -> bool:
    """Is a checkpoint due by the step count at ``step``? The same answer on every rank (the
    ranks share their settings, their step and their last save), so ranks that agree only
    now and then must agree at such a step: it is due here and nowhere else."""
    return every_steps is not None and step > 0 and step % every_steps == 0 and step != last_saved_step


def asked_at(point: SafePoint) -> Asked:
    """What this rank is asked: any request or checkpoint signal saves (even a step already saved:
    its asker waits for an answer); a stop signal or a stop/restart request stops."""
    stop = point.stop_signal is not None or any(a != "checkpoint" for a in point.requests)
    save = due(point) or bool(point.requests) or point.checkpoint_signal
    return Asked(stop=stop, save=save)


def decide_at_safe_point(point: SafePoint, agreed: Asked) -> SafePointDecision:
    """What to do, given what the ranks agreed (``asked_at(point)`` alone with one process)."""
    if agreed.stop:
        return SafePointDecision(SafePointAction.STOP, _stop_reason(point))
    if not agreed.save:
        return SafePointDecision(SafePointAction.NOTHING, "nothing due")
    if point.saving and not due(point):
        # A save asked for now would wait for the one in flight: training goes on, and the
        # requests and signals that came meanwhile are answered by one save after it.
        return SafePointDecision(SafePointAction.NOTHING, "a save in flight: the save asked for waits for it")
    hold = min(point.last_blocked / ASKED_SAVE_SHARE, ASKED_SAVE_HOLD_SECONDS)
    if point.now - point.last_saved_time < hold and not due(point):
        return SafePointDecision(
            SafePointAction.NOTHING, "saves asked for take at most their share of training"
        )
    if point.requests:
        return SafePointDecision(SafePointAction.SAVE, "a checkpoint request")
    if point.checkpoint_signal:
        return SafePointDecision(SafePointAction.SAVE, "a checkpoint signal")
    if due(point):
        return SafePointDecision(SafePointAction.SAVE, "due")
    return SafePointDecision(SafePointAction.SAVE, "a checkpoint asked of another rank")


def _stop_reason(point: SafePoint) -> str:
    if point.stop_signal is not None:
        return signal.Signals(point.stop_signal).name
    if point.requests:  # a checkpoint request too, when another rank asked the stop
        return "a stop request"
    return "a stop asked of another rank"


def stop_exit_code(*, committed: bool, exit_code: int, failure_exit_code: int, under_agent: bool) -> int:
    """The exit status of a process that stops at a safe point. ``committed``: its checkpoint
    committed; ``exit_code`` / ``failure_exit_code``: the configured "resume me" and "the
    stop's checkpoint failed" statuses; ``under_agent``: a rank that torchrun's agent started
    under ``ferry run`` (``runtime.launch.under_ferry_agent``), which exits 0 after a commit,
    since torchrun takes any other status for a failure of its ranks, and ``ferry run`` reads
    the stop from the job's status and exits with ``exit_code`` itself. A failed stop exits
    with ``failure_exit_code`` everywhere: the agent must see that one fail."""
    if not committed:
        return failure_exit_code
    return 0 if under_agent else exit_code
