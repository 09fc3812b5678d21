"""The check that a save fits the grace period between a stop signal and SIGKILL."""

from __future__ import annotations

from ferry.knobs import GRACE_WARN_FRACTION


def slow_save_warning(save_seconds: float, grace_seconds: float | None) -> str | None:
    """The warning for a checkpoint that took ``save_seconds`` when a stop gets
    ``grace_seconds`` before SIGKILL, or None when it fits (or no grace period is known).

    A stop's save is about as long as a periodic one: past this fraction of the grace period,
    a stop may be killed before it commits, so the user hears it while it still works."""
    if not grace_seconds or save_seconds <= GRACE_WARN_FRACTION * grace_seconds:
        return None
    return (
        f"ferry: warning: a checkpoint took {save_seconds:.1f} s, over "
        f"{GRACE_WARN_FRACTION:.0%} of the {grace_seconds:.0f} s grace period; a stop may be "
        "killed before it commits: raise the grace period or save less state"
    )
