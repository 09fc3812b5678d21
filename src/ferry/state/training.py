"""The checkpoint tree of a training process: built, parsed back and restored in one place.

On disk (the layout every ferry checkpoint of a session has had; old ones must still load)::

    {"objects": {name: state, ...},          # left out by ranks > 0 when rank 0 holds it
     "ferry": {"global_step": int,
               "rng": GlobalRNG,             # every global random stream
               "grads": {name: Gradients},   # mid-accumulation .grad buffers
               "loaders": {name: position},  # LoaderTracker.position()
               "driver": name | None,        # the loader whose batches are the steps
               "frames": {...},              # zero-code mode: the loop's plain state
               "sharded_optimizers": {name: bool}}}  # only with sharded (FSDP) models

This module sits above the engine (it restores through ``apply_state`` and DCP) and below
the session, which decides when to capture and when to restore.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from torch import nn
from torch.optim import Optimizer

from ferry.engine import sharded
from ferry.engine.apply import apply_state
from ferry.errors import CorruptCheckpointError
from ferry.state.grads import Gradients
from ferry.state.loader import LoaderTracker
from ferry.state.rng import GlobalRNG

log = logging.getLogger("ferry")


@dataclass(frozen=True, kw_only=True)
class TrainingState:
    """One process's training state, as saved in (or read from) a checkpoint."""

    global_step: int
    """Steps done when the state was captured; training goes on with the next one."""
    rng: Any
    """``GlobalRNG()`` when captured (read at save time), its state dict when parsed."""
    loaders: dict[str, dict[str, Any]]
    """Each tracked DataLoader's position (epoch, batches, generators), by tracked name."""
    driver: str | None = None
    """The loader whose batches count the steps; None with ``ferry.step()`` only."""
    grads: dict[str, Any]
    """Gradient buffers by module name (``Gradients`` when captured, dicts when parsed)."""
    objects: dict[str, Any] | None = None
    """Tracked objects by name; None in a rank part whose objects rank 0 holds."""
    sharded_optimizers: dict[str, bool] | None = None
    """Per sharded model, whether its optimizers were saved with it through DCP."""
    frames: dict[str, Any] | None = None
    """Zero-code mode: what made the safe point and the plain state of the training loop's
    frames (``autotrack/frames.py``); None in explicit mode."""

    @classmethod
    def capture(
        cls,
        objects: dict[str, Any],
        loaders: Mapping[str, LoaderTracker],
        *,
        global_step: int,
        driver: str | None,
        keep_objects: Callable[[dict[str, Any]], bool],
        frames: dict[str, Any] | None = None,
    ) -> TrainingState:
        """The state of the live objects now. Sharded models are not in the tree (DCP writes
        them beside it); whether their optimizers go with them is. ``keep_objects`` says
        whether this process saves the other objects (rank 0 alone saves replicated ones)."""
        shards, plain = sharded.split(objects)
        return cls(
            objects=plain if keep_objects(plain) else None,
            global_step=global_step,
            rng=GlobalRNG(),
            grads={n: Gradients(m) for n, m in plain.items() if isinstance(m, nn.Module)},
            loaders={name: t.position() for name, t in loaders.items()},
            driver=driver,
            sharded_optimizers=sharded.optimizers_saved(shards) if shards else None,
            frames=frames,
        )

    def tree(self) -> dict[str, Any]:
        """The tree to save; key order is part of the on-disk layout."""
        ferry: dict[str, Any] = {
            "global_step": self.global_step,
            "rng": self.rng,
            "grads": self.grads,
            "loaders": self.loaders,
            "driver": self.driver,
        }
        if self.sharded_optimizers is not None:
            ferry["sharded_optimizers"] = self.sharded_optimizers
        if self.frames is not None:
            ferry["frames"] = self.frames
        return {**({"objects": self.objects} if self.objects is not None else {}), "ferry": ferry}

    @classmethod
    def parse(cls, tree: Any, where: str, *, part: bool = False) -> TrainingState:
        """The state in a loaded tree; ``part``: a rank's own part, which may lack objects."""
        if not isinstance(tree, dict) or not isinstance(tree.get("ferry"), dict):
            raise CorruptCheckpointError(
                f"{where} holds no training state (no 'ferry' section): it was not saved by a "
                "ferry session; load it with ferry.load(), or point the job at its own checkpoints"
            )
        saved, objects = tree["ferry"], tree.get("objects")
        if objects is None and not part:
            raise _corrupt(where, "objects", "a dict of tracked objects")
        step = saved.get("global_step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise _corrupt(where, "ferry.global_step", "a step number >= 0")
        loaders = _dict(saved.get("loaders"), where, "ferry.loaders")
        for name, position in loaders.items():
            _dict(position, where, f"ferry.loaders.{name}")
        driver = saved.get("driver")
        if driver is not None and not isinstance(driver, str):
            raise _corrupt(where, "ferry.driver", "a loader name")
        optim = saved.get("sharded_optimizers")
        frames = saved.get("frames")
        return cls(
            objects=None if objects is None else _dict(objects, where, "objects"),
            global_step=step,
            rng=_dict(saved.get("rng"), where, "ferry.rng"),
            grads=_dict(saved.get("grads", {}), where, "ferry.grads"),  # not in the oldest ones
            loaders=loaders,
            driver=driver,
            sharded_optimizers=None if optim is None else _dict(optim, where, "ferry.sharded_optimizers"),
            frames=None if frames is None else _dict(frames, where, "ferry.frames"),
        )

    def with_part(self, part: TrainingState) -> TrainingState:
        """Rank R's view: its own part, with rank 0's objects when the part has none."""
        return replace(part, objects=part.objects if part.objects is not None else self.objects)

    def saved_object(self, name: str) -> Any:
        return (self.objects or {}).get(name)

    def restore_objects(self, objects: Mapping[str, Any]) -> None:
        saved = self.objects or {}
        for name, obj in objects.items():
            if name in saved:
                apply_state(obj, saved[name], name)
                if isinstance(obj, Optimizer) and self.global_step > 0:
                    # what torch's step wrapper notes at the first step(): without it, an LR
                    # scheduler stepped before this process's first optimizer step (a resume
                    # at an epoch's end) warns of a call order the script never had
                    obj._opt_called = True  # type: ignore[attr-defined]
            else:
                log.warning("ferry: %s is tracked but not in the checkpoint; it starts fresh", name)

    def restore(self, objects: dict[str, Any], loaders: Mapping[str, LoaderTracker], url: str) -> None:
        """Put everything back, in this order: objects, sharded models (from the checkpoint
        at ``url``), global RNG streams, gradients, loader generators. The streams come after
        the objects, so that nothing done while restoring those (DCP included) moves them."""
        shards, plain = sharded.split(objects)
        self.restore_objects(plain)
        if shards:
            sharded.load(shards, f"{url}/{sharded.DCP_DIR}", self.sharded_optimizers or {})
        GlobalRNG().load_state_dict(self.rng)
        for name, grads in self.grads.items():
            module = objects.get(name)
            if isinstance(module, nn.Module):
                Gradients(module).load_state_dict(grads)
        for name, tracker in loaders.items():
            if name in self.loaders:
                tracker.restore_generators(self.loaders[name])


def _corrupt(where: str, field: str, expected: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"{where}: the training state's {field} is not {expected}; the checkpoint is damaged or "
        "from an incompatible ferry: resume from an older checkpoint"
    )


def _dict(value: Any, where: str, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _corrupt(where, field, "a dict")
    return value
