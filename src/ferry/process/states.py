"""The driver's checkpoint state machine as ferry enforces it, before the driver is called::

    RUNNING --lock--> LOCKED --checkpoint--> CHECKPOINTED --restore--> LOCKED --unlock--> RUNNING

FAILED is terminal. A step from the wrong state is refused with what to do ("lock it
first") rather than the driver's bare ``CUDA_ERROR_ILLEGAL_STATE``; ``PLANS`` are the
steps ``suspend`` and ``wake`` take from each state.
"""

from __future__ import annotations

from ferry.errors import ConfigError, ProcessCheckpointError
from ferry.process.driver import ProcessState

TRANSITIONS: dict[str, tuple[ProcessState, ProcessState]] = {
    "lock": (ProcessState.RUNNING, ProcessState.LOCKED),
    "checkpoint": (ProcessState.LOCKED, ProcessState.CHECKPOINTED),
    "restore": (ProcessState.CHECKPOINTED, ProcessState.LOCKED),
    "unlock": (ProcessState.LOCKED, ProcessState.RUNNING),
}

_WHAT_TO_DO: dict[tuple[str, ProcessState], str] = {
    ("lock", ProcessState.LOCKED): "it is already locked",
    ("lock", ProcessState.CHECKPOINTED): "it is suspended; wake it (restore, unlock) first",
    ("checkpoint", ProcessState.RUNNING): "lock it first (`ferry process suspend` locks and checkpoints)",
    ("checkpoint", ProcessState.CHECKPOINTED): "it is already checkpointed",
    ("restore", ProcessState.RUNNING): "it is not suspended",
    ("restore", ProcessState.LOCKED): "it is not checkpointed (restored already, or only locked): unlock it",
    ("unlock", ProcessState.RUNNING): "it is not locked",
    ("unlock", ProcessState.CHECKPOINTED): "restore it first (`ferry process wake` restores and unlocks)",
}

# The driver steps that take a process from each state to "suspended" or "awake".
PLANS: dict[str, dict[ProcessState, tuple[str, ...]]] = {
    "suspend": {
        ProcessState.RUNNING: ("lock", "checkpoint"),
        ProcessState.LOCKED: ("checkpoint",),
        ProcessState.CHECKPOINTED: (),
    },
    "wake": {
        ProcessState.CHECKPOINTED: ("restore", "unlock"),
        ProcessState.LOCKED: ("unlock",),
        ProcessState.RUNNING: (),
    },
}


def check_transition(op: str, state: ProcessState, pid: int) -> None:
    """Raise, saying what to do, unless the driver allows ``op`` from ``state``."""
    if op not in TRANSITIONS:
        raise ConfigError(f"unknown operation {op!r}; one of {', '.join(TRANSITIONS)}")
    _require_usable(state, pid)
    needed = TRANSITIONS[op][0]
    if state != needed:
        hint = _WHAT_TO_DO.get((op, state), "")
        raise ProcessCheckpointError(
            f"cannot {op} pid {pid}: it is {state.value}, {op} needs "
            f"{needed.value}" + (f"; {hint}" if hint else "")
        )


def plan(action: str, state: ProcessState, pid: int) -> tuple[str, ...]:
    """The driver steps ``suspend`` or ``wake`` take from ``state`` (empty: already there)."""
    _require_usable(state, pid)
    return PLANS[action][state]


def _require_usable(state: ProcessState, pid: int) -> None:
    if state == ProcessState.FAILED:
        raise ProcessCheckpointError(
            f"the driver reports that pid {pid} failed during a checkpoint or "
            "restore; it cannot be recovered: stop it and resume from a "
            "framework-level checkpoint"
        )
    if state in (ProcessState.CHECKPOINTING, ProcessState.RESTORING):
        raise ProcessCheckpointError(
            f"pid {pid} is {state.value} (another tool is moving its memory); wait and retry"
        )
