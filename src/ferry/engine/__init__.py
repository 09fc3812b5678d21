"""The checkpoint engine: snapshot, persist, verify, load, retention; sync and async.

info = save({"model": model, "opt": opt, "epoch": 3}, "ckpts/", step=100)
loaded = load("ckpts/", into={"model": model, "opt": opt, "epoch": 0})

Names are imported on first use: ``ferry inspect`` and ``ferry verify`` read manifests
through ferry.format (torch-free) without importing torch, which importing this package
must not do either.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ferry.engine.apply import apply_state
    from ferry.engine.asyncsave import AsyncSaver, SaveHandle
    from ferry.engine.catalog import CheckpointRef, apply_retention, list_checkpoints, split_url
    from ferry.engine.persist import CheckpointInfo
    from ferry.engine.reader import Loaded
    from ferry.engine.saveload import load, save
    from ferry.format.integrity import read_manifest, verify

_WHERE = {
    "AsyncSaver": "ferry.engine.asyncsave",
    "CheckpointInfo": "ferry.engine.persist",
    "CheckpointRef": "ferry.engine.catalog",
    "Loaded": "ferry.engine.reader",
    "SaveHandle": "ferry.engine.asyncsave",
    "apply_retention": "ferry.engine.catalog",
    "apply_state": "ferry.engine.apply",
    "list_checkpoints": "ferry.engine.catalog",
    "load": "ferry.engine.saveload",
    "read_manifest": "ferry.format.integrity",
    "save": "ferry.engine.saveload",
    "split_url": "ferry.engine.catalog",
    "verify": "ferry.format.integrity",
}
"""Each public name -> the module that defines it (verifying is the format's: ferry.format)."""


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:  # submodules (``from ferry.engine import sharded``) are found after this
        raise AttributeError(f"module 'ferry.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


__all__ = [
    "AsyncSaver",
    "CheckpointInfo",
    "CheckpointRef",
    "Loaded",
    "SaveHandle",
    "apply_retention",
    "apply_state",
    "list_checkpoints",
    "load",
    "read_manifest",
    "save",
    "split_url",
    "verify",
]
