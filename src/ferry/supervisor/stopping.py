"""What ``ferry run`` says while its worker stops: pure functions of plain values.

A stop signal only asks the worker to checkpoint at its next safe point; whether it got
there is read from the job's status. The lines never promise a checkpoint that may not
come, nor one that the job does not have.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from ferry.runtime.jobfiles import Status


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"


@dataclass(frozen=True, kw_only=True)
class StopProgress:
    """How far a stopping worker got, from the job's status: what the supervisor may say."""

    saving_step: int | None = None
    """The worker reached a safe point and is saving the checkpoint of this step (None: it
    has not reached one since it started stopping, as far as the status tells)."""
    last_checkpoint_step: int | None = None
    """The step of the job's newest committed checkpoint (None: it has none)."""


def stop_progress(status: Status) -> StopProgress:
    """What ``status.json`` tells of a stop in progress: "checkpointing" written since the
    current worker started is the save of its step; ``last_checkpoint`` is the newest commit."""
    started = float(status.get("worker_started", 0) or 0)
    saving = status.get("state") == "checkpointing" and float(status.get("updated", 0) or 0) >= started
    step = status.get("step")
    last = status.get("last_checkpoint")
    return StopProgress(
        saving_step=step if saving and isinstance(step, int) else None,
        last_checkpoint_step=last["step"] if last else None,
    )


def stop_notice(name: str, grace: float | None, *, repeated: bool, progress: StopProgress, pid: int) -> str:
    """The supervisor's line when it forwards the stop signal ``name`` (``grace``: the
    seconds left before SIGKILL, None: never): the first one asks for a checkpoint at the
    next safe point (a request: the worker may never reach one); a repeated one changes
    nothing, and the line says what will happen instead."""
    if not repeated:
        kill = (
            f"SIGKILL in {grace:g} s if it has not exited"
            if grace is not None
            else "no grace period (--grace)"
        )
        return f"ferry run: {name}: asked the worker to checkpoint at its next safe point and stop; {kill}"
    if progress.saving_step is not None:
        where = f"it is saving the checkpoint of step {progress.saving_step}, which signals do not interrupt"
    else:
        where = "it has not reached a safe point yet; further signals change nothing"
    if grace is None:
        then = f"with no grace period it is never killed: `kill -KILL {pid}` ends it"
    else:
        then = f"if it has not exited in {grace:.0f} s, SIGKILL ends it"
    return (
        f"ferry run: {name} again: the worker is already stopping ({where}); {then} "
        f"(no checkpoint from this stop; {what_stays(progress)})"
    )


def what_stays(progress: StopProgress) -> str:
    """What a stop that ends without its checkpoint leaves the job."""
    if progress.last_checkpoint_step is None:
        return "the job has no committed checkpoint: a new run starts from the beginning"
    return f"the last committed checkpoint, step {progress.last_checkpoint_step}, stays"


def grace_kill_notice(name: str, grace: float, progress: StopProgress) -> str:
    """The supervisor's line when the grace period of the stop ``name`` ends in SIGKILL."""
    if progress.saving_step is not None:
        why = f"it was still saving the checkpoint of step {progress.saving_step}"
    else:
        why = "it reached no safe point after the signal (`ferry help zero-code`: loops without one)"
    return (
        f"ferry run: the worker did not exit within {grace:g} s of {name} ({why}): killing its "
        f"process group with SIGKILL; this stop leaves no new checkpoint: {what_stays(progress)}"
    )
