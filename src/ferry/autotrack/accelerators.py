"""accelerate's gradient accumulation count, kept beside the loop's frames (zero-code mode).

A loop written with accelerate's own API (``with accelerator.accumulate(model):`` around
each batch, ``optimizer.step()`` every batch) syncs the gradients and steps the optimizer
when ``Accelerator.step``, the count of batches since the last sync, reaches
``gradient_accumulation_steps``. That count lives in the ``Accelerator``, a library object
that the frames' capture (``frames.py``) does not keep. A checkpoint taken between two
batches of one accumulation (which zero-code mode allows: the gradients are kept) resumed
with the count back at 0, so every later sync came one batch off and the weights differed.

Kept: the ``step`` of each ``Accelerator`` held by a local of the loop's frames (a module's
globals included) or by an attribute of their ``self``, by frame and name; restored into
the ``Accelerator`` found under the same frame and name at the restore point.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from ferry.autotrack.frames import is_module, key, loop_frames

_MAX_COUNT = 1 << 20


def _accelerator_class() -> type | None:
    module = sys.modules.get("accelerate.accelerator")
    found = getattr(module, "Accelerator", None)
    return found if isinstance(found, type) else None


def _held(frame: FrameType, cls: type) -> dict[str, Any]:
    """The accelerators held in ``frame``, by ``qualname:name`` (``:self.name``)."""
    file, qualname, _ = key(frame)
    scope = f"{file}:{qualname}"
    namespace = frame.f_globals if is_module(frame) else frame.f_locals
    found: dict[str, Any] = {}
    for name, value in list(namespace.items()):
        if isinstance(value, cls):
            found[f"{scope}:{name}"] = value
    owner = None if is_module(frame) else namespace.get("self")
    for name, value in list(getattr(owner, "__dict__", {}).items()):
        if isinstance(value, cls):
            found[f"{scope}:self.{name}"] = value
    return found


def accelerators(start: FrameType | None) -> dict[str, Any]:
    """Every ``Accelerator`` the loop's frames (from ``start`` outwards) hold, by where."""
    cls = _accelerator_class()
    if cls is None:
        return {}
    found: dict[str, Any] = {}
    for frame in loop_frames(start):
        found.update(_held(frame, cls))
    return found


def capture(start: FrameType | None) -> dict[str, int]:
    return {
        where: acc.step
        for where, acc in accelerators(start).items()
        if type(getattr(acc, "step", None)) is int
    }


def restore(start: FrameType | None, saved: Any) -> None:
    """Put each saved count back into the accelerator under the same frame and name; a
    missing or implausible record (it comes from a checkpoint) is left out."""
    if not isinstance(saved, dict) or not saved:
        return
    for where, acc in accelerators(start).items():
        count = saved.get(where)
        if type(count) is int and 0 <= count < _MAX_COUNT:
            acc.step = count
