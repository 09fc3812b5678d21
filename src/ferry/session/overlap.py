"""``overlap_snapshot``: which tensors a background save may copy after its safe point,
and the optimizer step pre-hook that waits for those copies (``ferry.engine.deferred``).

Only what an optimizer's own ``step()`` changes is deferred: the parameters a tracked
optimizer updates and that optimizer's per-parameter state. Everything else training may
change before that step (buffers such as batch-norm statistics, gradients, a model no
optimizer updates, e.g. an EMA copy) is copied at the safe point as always.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ferry.engine.deferred import OverlapBroken

log = logging.getLogger("ferry")


def _plain(t: object) -> bool:
    """A dense tensor of torch's own type (a subclass such as DTensor is not deferred)."""
    return (type(t) is torch.Tensor or type(t) is nn.Parameter) and t.numel() > 0  # type: ignore[union-attr]


def deferrable(objects: Mapping[str, Any]) -> dict[int, str]:
    """``data_ptr`` -> a name for the message, of each tensor that only the step of one of
    ``objects``' optimizers changes. An optimizer whose ``step`` does not run the step
    hooks (one that bypasses ``torch.optim.Optimizer``'s wrapper) defers nothing."""
    names: dict[int, str] = {}
    for name, obj in objects.items():
        if isinstance(obj, nn.Module):
            for pname, p in obj.named_parameters():
                names.setdefault(p.data_ptr(), f"{name}.{pname}")
    out: dict[int, str] = {}
    for name, opt in objects.items():
        if not isinstance(opt, Optimizer) or not getattr(type(opt).step, "hooked", False):
            continue
        for g, group in enumerate(opt.param_groups):
            for i, p in enumerate(group["params"]):
                if not _plain(p):
                    continue
                pname = names.get(p.data_ptr(), f"parameter {g}.{i} of {name}")
                out[p.data_ptr()] = pname
                for key, value in opt.state.get(p, {}).items():
                    if _plain(value):
                        out[value.data_ptr()] = f"{name}'s {key} of {pname}"
    return out


class Overlap:
    """One session's overlap: chooses what each background save defers, and makes every
    optimizer step wait (``copied``: the saver's) until the last save's copies are done.
    A save whose deferred tensors were changed before that (the script writes to them
    outside its optimizer's step) fails, and the overlap is off for the rest of the run."""

    def __init__(self, copied: Callable[[], OverlapBroken | None]) -> None:
        self._copied = copied
        self.on = True
        self._hook = register_optimizer_step_pre_hook(self._before_step)

    def defer(self, objects: Mapping[str, Any], blocking: bool) -> dict[int, str] | None:
        """What the save about to be taken may copy after its safe point (None: nothing)."""
        self._check()
        return deferrable(objects) if self.on and not blocking else None

    def _before_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        self._check()

    def _check(self) -> None:
        broken = self._copied()
        if broken is not None and self.on:
            self.on = False
            log.warning(
                "ferry: overlap_snapshot is off for the rest of this run: the script changes %s "
                "outside its optimizer's step; leave it off for this script (FERRY_OVERLAP_SNAPSHOT=0)",
                broken.changed,
            )

    def close(self) -> None:
        self._hook.remove()
