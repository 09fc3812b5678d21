"""ferry: make PyTorch training jobs preemptible and movable.

Explicit API (zero-code mode needs none of it)::

    import ferry
    ferry.track(model=model, optimizer=opt, scheduler=sched, loader=loader)
    for epoch in range(10):
        for x, y in loader:        # each batch request is a safe point
            ...
    ferry.resumed, ferry.global_step  # read-only view of the session
"""

from __future__ import annotations

from typing import Any

from ferry._version import __version__
from ferry.config import Config
from ferry.engine import CheckpointInfo, Loaded, load, save
from ferry.errors import (
    ConfigError,
    CorruptCheckpointError,
    FerryError,
    JobError,
    NoCheckpointError,
    ProcessCheckpointError,
    StorageError,
    UnsafeCheckpointError,
    UnsupportedStateError,
)
from ferry.functions import FunctionCheckpoint
from ferry.session import Session, checkpoint, close, configure, current, restore, step, track
from ferry.state.stateful import Stateful


def __getattr__(name: str) -> Any:
    """Live, read-only views of the current session: ``resumed``, ``global_step``,
    ``restored_step``."""
    if name in ("resumed", "global_step", "restored_step"):
        session = current(create=False)
        if session is None:
            return False if name == "resumed" else (0 if name == "global_step" else None)
        return getattr(session, name)
    raise AttributeError(f"module 'ferry' has no attribute {name!r}")


__all__ = [
    "CheckpointInfo",
    "Config",
    "ConfigError",
    "CorruptCheckpointError",
    "FerryError",
    "FunctionCheckpoint",
    "JobError",
    "Loaded",
    "NoCheckpointError",
    "ProcessCheckpointError",
    "Session",
    "Stateful",
    "StorageError",
    "UnsafeCheckpointError",
    "UnsupportedStateError",
    "__version__",
    "checkpoint",
    "close",
    "configure",
    "current",
    "load",
    "restore",
    "save",
    "step",
    "track",
]
