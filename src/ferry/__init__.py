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
from ferry.state.stateful import Stateful

__all__ = [
    "CheckpointInfo",
    "Config",
    "ConfigError",
    "CorruptCheckpointError",
    "FerryError",
    "JobError",
    "Loaded",
    "NoCheckpointError",
    "ProcessCheckpointError",
    "Stateful",
    "StorageError",
    "UnsafeCheckpointError",
    "UnsupportedStateError",
    "__version__",
    "load",
    "save",
]
