"""The session's handle on the training loop's frames (zero-code mode): what made the safe
point, the frames' plain state at each checkpoint, and its restore. ``frames.py`` does the
reading and writing; this module decides when, and tells the user what it cannot do."""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any

import torch
from torch import nn

from ferry.autotrack import frames

log = logging.getLogger("ferry")


def _owned(objects: dict[str, Any]) -> set[int]:
    """Ids and storage addresses of the tensors the tracked objects own: a local holding one
    of them is an alias to keep, never a value to copy and rebind."""
    owned: set[int] = set()

    def add(t: Any) -> None:
        if isinstance(t, torch.Tensor):
            owned.add(id(t))
            with contextlib.suppress(RuntimeError, NotImplementedError):  # no storage (meta)
                owned.add(t.untyped_storage().data_ptr())
            if t.grad is not None:
                add(t.grad)

    for obj in objects.values():
        if isinstance(obj, nn.Module):
            for t in [*obj.parameters(), *obj.buffers()]:
                add(t)
        elif isinstance(obj, torch.optim.Optimizer):
            for per_param in obj.state.values():
                for t in per_param.values():
                    add(t)
    return owned


class LoopKeeper:
    """Captures and restores the loop's frames for one session."""

    def __init__(self) -> None:
        self.by = "loader"
        """What makes the safe points: a loader's batch requests, optimizer steps, or the
        root model's forward ("loader", "optimizer", "forward")."""
        self.model: str | None = None
        """With "forward": the name of the model whose forward is the safe point."""
        self._reported: set[str] = set()
        self._containers: dict[str, tuple[int, str, str, int]] | None = None
        self._sampler_start: dict[str, Any] | None = None

    def capture(self, objects: dict[str, Any], loader: Any = None) -> dict[str, Any]:
        """The loop's state now; ``loader``: the driving DataLoader, whose sampler's plain
        attributes are kept too (``DistributedSampler.set_epoch`` runs before the epoch's
        ``iter()``, which an in-place resume does not run again)."""
        found = frames.capture(sys._getframe(1), _owned(objects))
        self._report([p.line() for p in found.problems])
        tracked = {id(o) for o in objects.values()}  # ferry.track(losses=losses) captures it
        self._check_containers({k: v for k, v in found.containers.items() if v[3] not in tracked})
        return {"by": self.by, "model": self.model, "frames": found.frames, "sampler": self._changed(loader)}

    def _changed(self, loader: Any) -> dict[str, Any]:
        """The sampler's plain attributes that training changed since the process started
        (the epoch of a DistributedSampler; not its rank or number of replicas, which may
        differ in a resume on other ranks)."""
        sampler = getattr(loader, "sampler", None)
        if sampler is None:
            return {}
        now = frames.plain_attributes(sampler)
        if self._sampler_start is None:
            self._sampler_start = now
        return {k: v for k, v in now.items() if k in self._sampler_start and self._sampler_start[k] != v}

    def prepare(self, saved: dict[str, Any], loader: Any) -> None:
        """Before the driving loader continues the saved epoch in place: put back the plain
        attributes training had changed on its sampler."""
        sampler = getattr(loader, "sampler", None)
        if sampler is None:
            return
        self._sampler_start = frames.plain_attributes(sampler)
        for name, value in (saved.get("sampler") or {}).items():
            if hasattr(sampler, name):
                setattr(sampler, name, value)

    def examine(self, objects: dict[str, Any], loader: Any = None) -> None:
        """At the first safe point, before any save: say what the checkpoints will miss, and
        note the lists and dicts the loop holds and the loader's sampler, to tell at each
        checkpoint which of them training changed."""
        self.capture(objects, loader)

    def _check_containers(self, now: dict[str, tuple[int, str, str, int]]) -> None:
        if self._containers is None:
            self._containers = now
            return
        for where, (print_, name, what, _) in now.items():
            before = self._containers.get(where)
            if before is not None and before[0] != print_:
                self._report(
                    [
                        f"ferry: warning: {where} ({what}) changes during training and "
                        "zero-code mode does not capture it: after a resume it holds only what the "
                        f"resumed run puts in; to make it exact: `ferry.track({_arg(name)}={name})`"
                    ]
                )
        self._containers.update({k: v for k, v in now.items() if k not in self._containers})

    def matches(self, saved: dict[str, Any]) -> bool:
        """Is this (the resumed process, before its restore point) the loop the checkpoint
        was taken in, frame for frame?"""
        here = frames.loop_frames(sys._getframe(1))
        return bool(saved.get("frames")) and frames.mismatch(saved["frames"], here) is None

    def restore(self, saved: dict[str, Any]) -> dict[int, Any]:
        """Put the loop's state back; returns the replaced values (id -> new value)."""
        here = frames.loop_frames(sys._getframe(1))
        why = frames.mismatch(saved.get("frames") or [], here)
        if why is not None:
            self._report(
                [
                    f"ferry: warning: the loop's counters and positions are not restored: {why}; "
                    "counters in plain Python restart (keep them in tracked state: `ferry.track(...)`)"
                ]
            )
            return {}
        swapped, failed = frames.restore(saved["frames"], here)
        self._report([f"ferry: warning: not restored: {what}" for what in failed])
        return swapped

    def _report(self, lines: list[str]) -> None:
        for line in lines:
            if line not in self._reported:
                self._reported.add(line)
                sys.stderr.write(line + "\n")


def _arg(name: str) -> str:
    return name.rsplit(".", 1)[-1]
