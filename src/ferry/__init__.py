"""ferry: make PyTorch training jobs preemptible and movable.

Explicit API (zero-code mode needs none of it)::

    import ferry
    ferry.track(model=model, optimizer=opt, scheduler=sched, loader=loader)
    for epoch in range(10):
        for x, y in loader:        # each batch request is a safe point
            ...
    ferry.resumed, ferry.global_step  # read-only view of the session

Names are imported on first use, so ``import ferry`` (and ferry's start-up hook in every
process of a job) stays cheap and does not import torch by itself. ``dir(ferry)`` lists
them all, and ``help(ferry.track)`` (or any other name) shows its whole docstring.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ferry._version import __version__

if TYPE_CHECKING:
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
    from ferry.ops.weights import state_dict
    from ferry.session import Session, checkpoint, close, configure, current, restore, step, track
    from ferry.state.stateful import Stateful

_EXPORTS = {
    "Config": "ferry.config",
    "CheckpointInfo": "ferry.engine",
    "Loaded": "ferry.engine",
    "load": "ferry.engine",
    "save": "ferry.engine",
    "FunctionCheckpoint": "ferry.functions",
    "state_dict": "ferry.ops.weights",
    "Stateful": "ferry.state.stateful",
    **dict.fromkeys(
        ["ConfigError", "CorruptCheckpointError", "FerryError", "JobError", "NoCheckpointError",
         "ProcessCheckpointError", "StorageError", "UnsafeCheckpointError", "UnsupportedStateError"],
        "ferry.errors",
    ),
    **dict.fromkeys(
        ["Session", "checkpoint", "close", "configure", "current", "restore", "step", "track"],
        "ferry.session",
    ),
}  # fmt: skip
_LIVE = ("resumed", "global_step", "restored_step")


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in _LIVE:  # live, read-only views of the current session
        from ferry.session import current

        session = current(create=False)
        if session is None:
            return {"resumed": False, "global_step": 0, "restored_step": None}[name]
        return getattr(session, name)
    raise AttributeError(f"module 'ferry' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API, imported or not yet (``dir(ferry)``, completion, ``help(ferry)``)."""
    return sorted({*globals(), *__all__, *_LIVE})


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
    "global_step",
    "load",
    "restore",
    "restored_step",
    "resumed",
    "save",
    "state_dict",
    "step",
    "track",
]  # fmt: skip
