"""Find the training state of a script that never mentions ferry.

Called at the restore point and before each checkpoint. Optimizers are found among live
objects (census.py knows them, without a walk of the heap at each call); the models are
the outermost modules that own their parameters; schedulers and grad scalers are found
beside them. Names must come out the same in the interrupted and the resumed process, so
they are built from structure (class, parameter shapes) and never from memory addresses
or creation times.
"""

from __future__ import annotations

import logging
import random
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from ferry.autotrack.census import census

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


def discover() -> dict[str, Any]:
    """name -> live object, for every piece of training state found. The objects come from
    the census (census.py: the heap is walked once); the answer is kept while nothing it
    depends on changed, a check of a few microseconds at each save."""
    census.look()
    optimizers = census.objects("optimizer")
    key = (census.generation, _groups(optimizers))
    if _last is not None and _last.key == key:
        found = {name: ref() for name, ref in _last.refs}
        if all(obj is not None for obj in found.values()):
            return found
    found = _name_all(optimizers)
    if not _owned(found, optimizers):  # a model no hook saw (copy.deepcopy, unpickled)
        census.walk()
        optimizers = census.objects("optimizer")
        found = _name_all(optimizers)
        _owned(found, optimizers, settle=True)
    _keep((census.generation, _groups(optimizers)), found)
    return found


class _Answer:
    """The last answer, held weakly: a dead object is never saved, and never kept alive."""

    def __init__(self, key: tuple[int, tuple[tuple[int, int], ...]], found: dict[str, Any]) -> None:
        self.key = key
        self.refs = [(name, weakref.ref(obj)) for name, obj in found.items()]


_last: _Answer | None = None
_ownerless: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
"""Trained tensors that no module holds, as the last walk found them: no reason to walk again."""


def _keep(key: tuple[int, tuple[tuple[int, int], ...]], found: dict[str, Any]) -> None:
    global _last
    _last = _Answer(key, found)


def _groups(optimizers: list[torch.optim.Optimizer]) -> tuple[tuple[int, int], ...]:
    """What the optimizers train, in brief: each parameter group's list, and its length
    (``add_param_group``, or a group's list replaced, changes it)."""
    return tuple((id(g["params"]), len(g["params"])) for opt in optimizers for g in opt.param_groups)


def _name_all(optimizers: list[torch.optim.Optimizer]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    taken: dict[str, int] = {}
    optimizers = sorted(optimizers, key=_optimizer_key)
    opt_names = {}
    for opt in optimizers:
        opt_names[id(opt)] = name = _name("optimizer", opt, taken)
        found[name] = opt
    for m in _roots(census.objects("module"), {id(p) for p in _trained(optimizers)}):
        found[_name("model", m, taken)] = m
    schedulers = [s for s in census.objects("scheduler") if id(getattr(s, "optimizer", None)) in opt_names]
    schedulers.sort(key=lambda s: (opt_names[id(s.optimizer)], type(s).__qualname__))
    for s in schedulers:
        found[_name(f"scheduler[{opt_names[id(s.optimizer)]}]", s, taken)] = s
    for scaler in sorted(census.objects("scaler"), key=lambda s: type(s).__qualname__):
        found[_name("scaler", scaler, taken)] = scaler
    return found


def _trained(optimizers: list[torch.optim.Optimizer]) -> list[torch.Tensor]:
    return [p for o in optimizers for g in o.param_groups for p in g["params"]]


def _owned(found: dict[str, Any], optimizers: list[torch.optim.Optimizer], settle: bool = False) -> bool:
    """Whether every trained tensor is a parameter of a model found (or known to have no
    module); ``settle``: those that are not are known so from now on (after a walk)."""
    held = {id(p) for name, m in found.items() if name.startswith("model:") for p in m.parameters()}
    loose = [p for p in _trained(optimizers) if id(p) not in held and _ownerless.get(id(p)) is not p]
    if settle:
        for p in loose:
            _ownerless[id(p)] = p
    return not loose


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
