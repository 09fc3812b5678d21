"""The live training objects of a zero-code process, known without a walk at every save.

Discovery needs every optimizer, module, LR scheduler and grad scaler alive. A walk of
``gc.get_objects()`` finds them, but in a process that has imported torch (300,000 objects
and more) it takes a tenth of a second or more of the training thread. So the census
walks once, at the first look, and from then on learns of new objects as they are made:

- modules through torch's global registration hooks: a parameter or a submodule set on a
  module (how every model, wrapper and container is built);
- optimizers, LR schedulers and grad scalers as their base class's ``__init__`` returns
  (wrapped where torch defines it: same name, signature and ``__wrapped__``);
- whatever neither sees (an optimizer made by ``copy.deepcopy`` or unpickled, a scheduler
  class whose ``__init__`` calls no base one) by a check at each look that costs
  microseconds: every instance holds a reference to its class, so a class with more
  references than before, beyond the instances the census knows, has instances it has
  not seen. Only then is the heap walked again.

The dead drop out by themselves (weak references). ``generation`` changes whenever what
is known may have changed: discovery keeps its answer until it does (discovery.py).
"""

from __future__ import annotations

import functools
import gc
import itertools
import sys
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.optim import lr_scheduler

KINDS = ("optimizer", "scheduler", "scaler")
"""The kinds of stateful objects known by class; modules are known by their hooks."""


def _subclasses(bases: Iterable[type]) -> list[type]:
    """``bases`` and every class derived from them, each once."""
    seen: dict[type, None] = {}
    todo = list(bases)
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen[cls] = None
            todo.extend(type.__subclasses__(cls))
    return list(seen)


def _scaler_bases() -> list[type]:
    import torch.amp

    return [torch.amp.GradScaler]


def _bases() -> dict[str, list[type]]:
    scheduler = getattr(lr_scheduler, "LRScheduler", None) or lr_scheduler._LRScheduler
    return {
        "optimizer": [torch.optim.Optimizer],
        "scheduler": [scheduler, lr_scheduler.ReduceLROnPlateau],
        "scaler": _scaler_bases(),
    }


def _inits() -> dict[str, list[type]]:
    """The classes whose ``__init__`` is wrapped: each kind's base, and torch's schedulers
    that do not call the base's (the check finds the rest)."""
    bases = _bases()
    schedulers = [*bases["scheduler"]]
    for name in ("SequentialLR", "ChainedScheduler"):
        cls = getattr(lr_scheduler, name, None)
        if isinstance(cls, type) and "__init__" in vars(cls):
            schedulers.append(cls)
    return {"optimizer": bases["optimizer"], "scheduler": schedulers, "scaler": bases["scaler"]}


class Census:
    """Every optimizer, module, scheduler and scaler alive that the census has seen."""

    def __init__(self) -> None:
        self.known: dict[str, weakref.WeakSet[Any]] = {k: weakref.WeakSet() for k in (*KINDS, "module")}
        self.generation = 0
        self.walks = 0
        """How many times the heap was walked (once, unless the check found strays)."""
        self._installed = False
        self._unseen: dict[int, int] = {}
        """Per class (by id): its references beyond the instances known, at the last look."""

    def objects(self, kind: str) -> list[Any]:
        return list(self.known[kind])

    def look(self) -> None:
        """Bring the census up to date: the first time, hooks and a walk; after that, a
        walk only when the check says instances were made that no hook saw."""
        if not self._installed:
            self._install()
            self.walk()
        elif self._strays():
            self.walk()

    def add(self, kind: str, obj: Any) -> None:
        self.known[kind].add(obj)
        self.generation += 1

    def walk(self) -> None:
        """Every object of the heap looked at once."""
        self.walks += 1
        for kind, obj in _heap():
            known = self.known[kind]
            if obj not in known:
                known.add(obj)
                self.generation += 1
        self._strays()  # the counts from here on

    def _strays(self) -> bool:
        """Whether some class of a kind has more references than at the last look beyond
        the instances known (a new class counts as one): instances no hook saw. The counts
        are kept by the classes' ids, so that keeping them adds no reference."""
        classes = [cls for bases in _bases().values() for cls in _subclasses(bases)]
        refs = [sys.getrefcount(cls) for cls in classes]
        mine = Counter(id(type(obj)) for kind in KINDS for obj in self.known[kind])
        unseen = {id(cls): n - mine[id(cls)] for cls, n in zip(classes, refs, strict=True)}
        before, self._unseen = self._unseen, unseen
        return bool(before) and any(n > before.get(key, -1) for key, n in unseen.items())

    def _install(self) -> None:
        self._installed = True
        module = nn.modules.module
        module.register_module_parameter_registration_hook(self._registered)
        module.register_module_module_registration_hook(self._registered)
        for kind, classes in _inits().items():
            for cls in classes:
                cls.__init__ = _noting(cls.__init__, functools.partial(self.add, kind))  # type: ignore[misc]

    def _registered(self, module: nn.Module, name: str, value: object) -> None:
        """A parameter or submodule was set on ``module``: it may be (or hold) a model now."""
        self.add("module", module)


def _heap() -> list[tuple[str, Any]]:
    """(kind, object) for every object of a kind and every module on the heap, looked at in
    C (``map``, ``compress``): a loop in Python took 1 us an object."""
    classes = {cls: kind for kind, bases in _bases().items() for cls in _subclasses(bases)}
    classes.update(dict.fromkeys(_subclasses([nn.Module]), "module"))
    objs = gc.get_objects()
    hits = itertools.compress(objs, map(classes.__contains__, map(type, objs)))
    return [(classes[type(obj)], obj) for obj in hits]


def _noting(init: Callable[..., None], note: Callable[[Any], None]) -> Callable[..., None]:
    """``init``, which then tells ``note`` of the object it initialised."""

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        note(self)

    return __init__


census = Census()
"""The process's census (zero-code mode has one session per process)."""
