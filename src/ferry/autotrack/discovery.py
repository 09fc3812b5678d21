"""Find the training state of a script that never mentions ferry.

Called at the restore point and before each checkpoint. Optimizers are found among live
objects; the models are the outermost modules that own their parameters; schedulers and
grad scalers are found beside them. Names must come out the same in the interrupted and
the resumed process, so they are built from structure (class, parameter shapes) and never
from memory addresses or creation times.
"""

from __future__ import annotations

import gc
import logging
import random
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

log = logging.getLogger("ferry")


def _numel(params: Iterable[torch.Tensor]) -> int:
    return sum(p.numel() for p in params)


def _name(kind: str, obj: Any, taken: dict[str, int]) -> str:
    base = f"{kind}:{type(obj).__qualname__}"
    index = taken.get(base, 0)
    taken[base] = index + 1
    return f"{base}:{index}"


def _optimizer_key(opt: torch.optim.Optimizer) -> tuple[Any, ...]:
    groups = tuple(tuple(tuple(p.shape) for p in g["params"]) for g in opt.param_groups)
    return (type(opt).__qualname__, groups)


def _module_key(m: nn.Module) -> tuple[Any, ...]:
    return (type(m).__qualname__, tuple((n, tuple(p.shape)) for n, p in m.named_parameters()))


def _scheduler_types() -> tuple[type, ...]:
    sched = torch.optim.lr_scheduler
    base = getattr(sched, "LRScheduler", None) or sched._LRScheduler
    plateau = getattr(sched, "ReduceLROnPlateau", base)
    return (base, plateau)


def _scaler_types() -> tuple[type, ...]:
    types: list[type] = []
    for path in ("torch.amp.GradScaler", "torch.cuda.amp.GradScaler", "torch.cpu.amp.GradScaler"):
        module, _, name = path.rpartition(".")
        try:
            cls = getattr(__import__(module, fromlist=[name]), name)
        except (ImportError, AttributeError):
            continue
        if isinstance(cls, type):
            types.append(cls)
    return tuple(types)


def discover() -> dict[str, Any]:
    """name -> live object, for every piece of training state found."""
    optimizers: list[torch.optim.Optimizer] = []
    modules: list[nn.Module] = []
    schedulers: list[Any] = []
    scalers: list[Any] = []
    sched_types, scaler_types = _scheduler_types(), _scaler_types()
    for obj in gc.get_objects():
        cls = type(obj)  # not isinstance: some torch objects warn when asked for __class__
        if issubclass(cls, torch.optim.Optimizer):
            optimizers.append(obj)
        elif issubclass(cls, nn.Module):
            modules.append(obj)
        elif issubclass(cls, sched_types):
            schedulers.append(obj)
        elif scaler_types and issubclass(cls, scaler_types):
            scalers.append(obj)
    found: dict[str, Any] = {}
    taken: dict[str, int] = {}
    optimizers.sort(key=_optimizer_key)
    opt_names = {}
    for opt in optimizers:
        opt_names[id(opt)] = name = _name("optimizer", opt, taken)
        found[name] = opt
    for m in _roots(modules, {id(p) for o in optimizers for g in o.param_groups for p in g["params"]}):
        found[_name("model", m, taken)] = m
    schedulers = [s for s in schedulers if id(getattr(s, "optimizer", None)) in opt_names]
    schedulers.sort(key=lambda s: (opt_names[id(s.optimizer)], type(s).__qualname__))
    for s in schedulers:
        found[_name(f"scheduler[{opt_names[id(s.optimizer)]}]", s, taken)] = s
    for scaler in sorted(scalers, key=lambda s: type(s).__qualname__):
        found[_name("scaler", scaler, taken)] = scaler
    return found


def _roots(modules: list[nn.Module], trained: set[int]) -> list[nn.Module]:
    """The outermost modules holding trained parameters (a compiled or DDP wrapper counts
    as the outermost one: its state dict is the one the script would save)."""
    owners = [m for m in modules if any(id(p) in trained for p in m.parameters())]
    inner: set[int] = set()
    for m in owners:
        inner.update(id(c) for c in m.modules() if c is not m)
    roots = [m for m in owners if id(m) not in inner]
    return sorted(roots, key=_module_key)


def _fingerprint(obj: Any) -> int:
    """A number that changes when the generator draws: its state, hashed."""
    if isinstance(obj, random.Random):
        return hash(obj.getstate())
    if isinstance(obj, np.random.Generator):
        return hash(repr(obj.bit_generator.state))
    return hash(bytes(obj.get_state().numpy()))


def uncaptured_rngs() -> dict[str, tuple[str, int]]:
    """Random generators held in the script's globals, name -> (what, fingerprint of its
    state): zero-code mode cannot tell what they are for, so it watches whether training
    draws from them and says so instead of guessing (session/rngwatch.py). Libraries
    keep private generators of their own, which do not affect training; those are left alone."""
    import sys

    main = sys.modules.get("__main__")
    found: dict[str, tuple[str, int]] = {}
    for name, obj in list(vars(main).items()) if main is not None else []:
        cls = type(obj)
        if issubclass(cls, random.Random) and obj is not getattr(random, "_inst", None):
            found[name] = ("a random.Random", _fingerprint(obj))
        elif issubclass(cls, np.random.Generator):
            found[name] = ("a numpy Generator", _fingerprint(obj))
        elif issubclass(cls, torch.Generator):
            found[name] = ("a torch.Generator", _fingerprint(obj))
    return found
