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
from ferry.engine.snapshot import PACK_MAX

log = logging.getLogger("ferry")


def _deferred(t: object) -> bool:
    """A dense tensor of torch's own type (a subclass such as DTensor keeps its values
    elsewhere), big enough not to be packed at the safe point anyway (``PACK_MAX``)."""
    return (type(t) is torch.Tensor or type(t) is nn.Parameter) and t.nbytes >= PACK_MAX  # type: ignore[union-attr]


_NONE: dict[str, Any] = {}


class _Names:
    """The tracked modules' parameter names by ``data_ptr``, looked up only when a message
    needs one: walking a model of ten thousand parameters costs tens of milliseconds, and
    the walk would block training at every save."""

    def __init__(self, objects: Mapping[str, Any]) -> None:
        self._objects = dict(objects)
        self._by_ptr: dict[int, str] | None = None

    def of(self, ptr: int) -> str | None:
        if self._by_ptr is None:
            self._by_ptr = {}
            for name, obj in self._objects.items():
                if isinstance(obj, nn.Module):
                    for pname, p in obj.named_parameters():
                        self._by_ptr.setdefault(p.data_ptr(), f"{name}.{pname}")
        return self._by_ptr.get(ptr)


class _Label:
    """Names a deferred tensor in a message (``str``): a parameter by its module's name for
    it, else by its place in the optimizer; a state tensor as the state of that parameter."""

    __slots__ = ("_names", "_param", "_where")

    def __init__(self, names: _Names, param: torch.Tensor, where: tuple[str, int, int, str]) -> None:
        self._names, self._param, self._where = names, param, where

    def __str__(self) -> str:
        optimizer, group, index, state = self._where
        param = self._names.of(self._param.data_ptr()) or f"parameter {group}.{index} of {optimizer}"
        return f"{optimizer}'s {state} of {param}" if state else param


def deferrable(objects: Mapping[str, Any]) -> dict[int, object]:
    """``data_ptr`` -> a label (its ``str`` names it), of each tensor that only the step of
    one of ``objects``' optimizers changes. An optimizer whose ``step`` does not run the
    step hooks (one that bypasses ``torch.optim.Optimizer``'s wrapper) defers nothing."""
    names = _Names(objects)
    out: dict[int, object] = {}
    for name, opt in objects.items():
        if not isinstance(opt, Optimizer) or not getattr(type(opt).step, "hooked", False):
            continue
        state = opt.state  # a defaultdict: .get adds nothing
        for g, group in enumerate(opt.param_groups):
            for i, p in enumerate(group["params"]):
                if _deferred(p):
                    out[p.data_ptr()] = _Label(names, p, (name, g, i, ""))
                for key, value in state.get(p, _NONE).items():
                    if _deferred(value):
                        out[value.data_ptr()] = _Label(names, p, (name, g, i, str(key)))
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

    def defer(self, objects: Mapping[str, Any], blocking: bool) -> dict[int, object] | None:
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
