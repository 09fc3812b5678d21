"""The session's handle on the training loop's frames (zero-code mode): what made the safe
point, the frames' state at each checkpoint, and its restore. ``frames.py`` reads the
frames, ``restore.py`` writes them back; this module decides when, and tells the user what
it cannot do."""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any

import torch
from torch import nn

from ferry.autotrack import codeid, frames, restore
from ferry.autotrack.values import Digests, Values, Watched
from ferry.errors import CorruptCheckpointError
from ferry.state.frameparse import parse
from ferry.state.framestate import PRIMITIVES, Fingerprint, Legacy, Section, is_name, is_plain

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
            for group in obj.param_groups:
                for t in group["params"]:
                    add(t)
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
        self._signatures: dict[str, int] | None = None
        """Each container of the loop's frames as first seen (at the first safe point)."""
        self._first: dict[str, Fingerprint] | None = None
        """Big arrays of the script's objects as its set-up made them: at the first safe
        point, or in a resumed process before the restore writes anything."""
        self._sampler_start: dict[str, Any] | None = None
        self._digests = Digests()
        self._parsed: tuple[int, Section | Legacy] | None = None

    def capture(self, objects: dict[str, Any], loader: Any = None) -> dict[str, Any]:
        """The loop's state now; ``loader``: the driving DataLoader, whose sampler's plain
        attributes are kept too (``DistributedSampler.set_epoch`` runs before the epoch's
        ``iter()``, which an in-place resume does not run again)."""
        found = self._look(objects, sys._getframe(1), looking=False)
        section = Section(self.by, self.model, codeid.python(), self._changed(loader), tuple(found.frames))
        tree = section.tree()
        try:  # what the resume will check: a section it refuses would make the checkpoint useless
            parse(tree, "this checkpoint")
        except CorruptCheckpointError as exc:
            self._report(
                [f"ferry: warning: the loop's state is left out of this checkpoint (a bug in ferry): {exc}"]
            )
            return Section(self.by, self.model, codeid.python(), {}, ()).tree()
        return tree

    def examine(self, objects: dict[str, Any], loader: Any = None) -> None:
        """At the first safe point, before any save: say what the checkpoints will miss, and
        note what the loop holds and cannot be captured, and the loader's sampler, to tell at
        each checkpoint which of them training changed."""
        found = self._look(objects, sys._getframe(1), looking=True)
        if self._first is None:
            self._first = found.big
        self._changed(loader)

    def _look(self, objects: dict[str, Any], start: Any, *, looking: bool) -> frames.Captured:
        tracked = {id(o) for o in objects.values()}  # ferry.track(losses=losses) captures it
        values = Values(_owned(objects), tracked, self._digests, self._first, looking=looking)
        found = frames.capture(frames.loop_frames(start), values)
        self._report([p.line() for p in found.problems])
        self._check_watched(found.watched, found.signatures)
        return found

    def _changed(self, loader: Any) -> dict[str, Any]:
        """The sampler's plain attributes that training changed since the process started
        (the epoch of a DistributedSampler; not its rank or number of replicas, which may
        differ in a resume on other ranks)."""
        sampler = getattr(loader, "sampler", None)
        if sampler is None:
            return {}
        now = _scalars(sampler)
        if self._sampler_start is None:
            self._sampler_start = now
        return {k: v for k, v in now.items() if k in self._sampler_start and self._sampler_start[k] != v}

    def prepare(self, saved: dict[str, Any], loader: Any) -> None:
        """Before the driving loader continues the saved epoch in place: put back the plain
        attributes training had changed on its sampler (those it has now, of the same type)."""
        section = self._section(saved)
        sampler = getattr(loader, "sampler", None)
        if sampler is None or not isinstance(section, Section):
            return
        self._sampler_start = _scalars(sampler)
        attributes = vars(sampler)
        for name, value in section.sampler.items():
            if name in attributes and type(attributes[name]) is type(value):
                attributes[name] = value
            else:
                self._report(
                    [f"ferry: warning: not restored: the sampler's `{name}`: it has none of that type now"]
                )

    def _check_watched(self, watched: dict[str, Watched], signatures: dict[str, int]) -> None:
        """Say which containers that are not captured changed since they were first seen."""
        if self._signatures is None:
            self._signatures = signatures
            return
        for key, found in watched.items():
            before = self._signatures.get(key)
            if before is not None and before != found.signature:
                self._report(
                    [
                        f"ferry: warning: {found.where} ({found.what}) changes during training and "
                        "zero-code mode does not capture it: after a resume it holds only what the "
                        f"resumed run puts in; to make it exact: {found.fix}"
                    ]
                )
        self._signatures.update({k: v for k, v in signatures.items() if k not in self._signatures})

    def _section(self, saved: dict[str, Any]) -> Section | Legacy:
        if self._parsed is None or self._parsed[0] != id(saved):
            self._parsed = (id(saved), parse(saved, "the checkpoint"))
        return self._parsed[1]

    def matches(self, saved: dict[str, Any]) -> bool:
        """Is this (the resumed process, before its restore point) the loop the checkpoint
        was taken in, frame for frame, running the same code?"""
        section = self._section(saved)
        here = frames.loop_frames(sys._getframe(1))
        return (
            isinstance(section, Section)
            and bool(section.frames)
            and frames.mismatch(section.frames, here, section.python) is None
        )

    def restore(self, saved: dict[str, Any]) -> dict[int, Any]:
        """Put the loop's state back; returns the replaced values (id -> new value)."""
        section = self._section(saved)
        here = frames.loop_frames(sys._getframe(1))
        if self._first is None:  # what this process's set-up made, before anything is written
            self._first = frames.capture(here, Values(set(), set(), self._digests, None, looking=True)).big
        if isinstance(section, Legacy):
            why: str | None = (
                "the checkpoint was written by an earlier ferry, which did not record the loop's code"
            )
        else:
            why = frames.mismatch(section.frames, here, section.python)
        if why is not None or not isinstance(section, Section):
            self._report(
                [
                    f"ferry: warning: the loop's counters and positions are not restored: {why}; "
                    "counters in plain Python restart (keep them in tracked state: `ferry.track(...)`)"
                ]
            )
            return {}
        done = restore.restore(section.frames, here, self._digests)
        self._report([f"ferry: warning: not restored: {what}" for what in done.refused])
        self._report(
            [
                f"ferry: warning: {what}: after the resume it holds what the resumed run made; to make "
                "it exact, load the same data before the loop, or keep it in an object the script "
                "tracks (`ferry.track(name=obj)`, with state_dict()/load_state_dict())"
                for what in done.differs
            ]
        )
        return done.swapped

    def _report(self, lines: list[str]) -> None:
        for line in lines:
            if line not in self._reported:
                self._reported.add(line)
                sys.stderr.write(line + "\n")


def _scalars(obj: Any) -> dict[str, Any]:
    """The scalar attributes of an object (a sampler's epoch, seed, ...)."""
    return {
        k: v
        for k, v in getattr(obj, "__dict__", {}).items()
        if type(v) in PRIMITIVES and is_name(k) and is_plain(v)
    }
