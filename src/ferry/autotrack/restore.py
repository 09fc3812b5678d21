"""Writing a checkpoint's frame state into the resumed process's frames: every field is
checked against the frame it goes into, and one that does not fit is not written.

The section was parsed already (``state/framestate.py``: types, lengths, nesting), and the
frames run the code it was taken in (``frames.mismatch``). What is checked here is what only
the live frames can tell:

- a name is written only if the frame's code defines it, over a value that is plain (or
  unbound): never over a module, a function, a model or any other object (``model = 3``);
- attributes are written only on objects of the script's own classes (the capture's test,
  made again on the live object), only to attributes the object has now, with a value of
  the kind the attribute holds now; straight into the object's ``__dict__``, so that no
  property, ``__setattr__`` or descriptor runs;
- a loop's position must lie within what the loop iterates now, of the same kind of
  iterator; an ``enumerate`` keeps its count; a generator that wraps the loader must be the
  one whose frame is written, and that frame must run the instruction it ran at the
  checkpoint (else nothing of it is written, and what it held ahead is said to be lost);
- a big array kept by fingerprint is compared with the resumed process's own.

Each field refused is one line naming the frame and the field; the rest is written.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import numpy as np
import torch

from ferry.autotrack import ranges, stack
from ferry.autotrack.frames import is_generator, is_module, loader_generator, names_of, where
from ferry.autotrack.values import Digests, own_kind
from ferry.state.framestate import (
    GENERATOR,
    LOADER,
    POSITIONED,
    RANGE,
    REVERSED,
    Entry,
    Enumerated,
    Frame,
    LoopState,
)

_MISSING: Any = object()
_KEEP: Any = object()


@dataclass
class Restored:
    swapped: dict[int, Any] = field(default_factory=dict)
    """{id of a tensor replaced in a frame: its new value} (to swap arguments taken already)."""
    refused: list[str] = field(default_factory=list)
    """One line per field not written: where, what, why."""
    differs: list[str] = field(default_factory=list)
    """Big arrays kept by fingerprint that the resumed process holds otherwise."""


def restore(saved: tuple[Frame, ...], frames: list[FrameType], digests: Digests) -> Restored:
    """Write ``saved`` into ``frames`` (the same chain, the same code: ``frames.mismatch``)."""
    chain = _Chain(frames, {i for i, (s, f) in enumerate(zip(saved, frames, strict=True)) if _moved(s, f)})
    writer = _Writer(digests, chain)
    for i, (state, frame) in enumerate(zip(saved, frames, strict=True)):
        if i in chain.moved:
            writer.out.refused.append(
                f"{where(frame)}: runs instruction {stack.instruction(frame)} now, the checkpoint's "
                f"frame ran {state.offset}: nothing of it is written, and the batches it held ahead "
                "of training are not restored: this resume is not exact"
            )
        else:
            writer.frame(state, frame)
    return writer.out


def _moved(state: Frame, frame: FrameType) -> bool:
    """Does a generator's frame run another instruction than it did at the checkpoint (or
    has a frame an offset it could not have: a generator's without one, another's with one)?"""
    if state.offset is None and not is_generator(frame):
        return False
    return stack.instruction(frame) != state.offset


@dataclass(frozen=True)
class _Chain:
    """The frames written into, and those of generators that are not (they moved)."""

    frames: list[FrameType]
    moved: set[int]

    def generator(self, it: Any, at: int) -> str | None:
        """Is ``it`` the generator whose frame is ``frames[at]``, and is that frame written?"""
        frame = getattr(it, "gi_frame", None)
        if not 0 <= at < len(self.frames) or frame is not self.frames[at]:
            return f"the loop iterates {_a(it)} now, not the generator the checkpoint's did"
        if at in self.moved:
            return "the generator it iterates is not restored, the loop starts over"
        return None


class _Writer:
    def __init__(self, digests: Digests, chain: _Chain) -> None:
        self.out = Restored()
        self.digests = digests
        self.chain = chain
        self.aliases: dict[int, Any] = {}

    def frame(self, state: Frame, frame: FrameType) -> None:
        here = where(frame)
        for i, loop in enumerate(state.loops):
            why = _position(frame, loop.slot, loop.state, self.chain)
            if why is not None:
                self.out.refused.append(f"{here}: loops[{i}] ({loop.state.kind.lstrip('?')}): {why}")
        module = is_module(frame)
        namespace = frame.f_globals if module else frame.f_locals
        defined = set(names_of(frame))
        updates: dict[str, Any] = {}
        for name, entry in state.values.items():
            label = f"{here}: `{name}`"
            if name not in defined:
                self.out.refused.append(f"{label}: not a variable of this code, not written")
                continue
            new = self.bind(entry, namespace.get(name, _MISSING), label)
            if new is not _KEEP:
                updates[name] = new
        _write(frame, namespace, updates, module)

    def bind(self, entry: Entry, live: Any, label: str) -> Any:
        """The new value of a name that holds ``live`` (``_MISSING``: unbound), or _KEEP."""
        if entry.kind == "object":
            self._object(entry, live, label)
            return _KEEP
        if entry.kind == "fingerprint":
            self._compare(entry, live, label)
            return _KEEP
        if live is not _MISSING and _category(live) is None:
            self.out.refused.append(f"{label}: holds {_a(live)} now, not a plain value: not overwritten")
            return _KEEP
        new = self._value(entry, live)
        if isinstance(live, torch.Tensor):
            self.out.swapped[id(live)] = new
        return new

    def _object(self, entry: Entry, obj: Any, label: str) -> None:
        kind = own_kind(obj)
        if kind is None:
            self.out.refused.append(
                f"{label}: holds {_a(obj)} now, not an object of the script's classes: "
                "its attributes are not written"
            )
            return
        attributes = vars(obj)
        for attr, sub in entry.attrs.items():
            at = f"{label[:-1]}.{attr}`"
            if attr not in attributes:
                self.out.refused.append(f"{at}: the object has no such attribute now, not written")
                continue
            live = attributes[attr]
            if sub.kind in ("object", "fingerprint"):
                self.bind(sub, live, at)
                continue
            saved_kind, live_kind = _category(sub.value if sub.kind == "value" else set()), _category(live)
            if live_kind is None or (kind == "mixed" and saved_kind not in ("number", "str", "none")):
                self.out.refused.append(f"{at}: holds {_a(live)} now, not a plain value: not overwritten")
            elif saved_kind != live_kind and "none" not in (saved_kind, live_kind):
                self.out.refused.append(
                    f"{at}: holds {_a(live)} now, the checkpoint {_a(sub.value)}: not overwritten"
                )
            else:
                attributes[attr] = self._value(sub, live)

    def _compare(self, entry: Entry, live: Any, label: str) -> None:
        saved = entry.fingerprint
        if live is _MISSING or saved is None:
            return  # the resumed run has not made it yet: nothing to tell it from
        try:
            now = self.digests.of(live) if type(live) in (torch.Tensor, np.ndarray) else None
        except (RuntimeError, NotImplementedError):
            now = None
        if now != saved:
            size = "x".join(map(str, saved.shape))
            self.out.differs.append(
                f"{label} holds other data than when the checkpoint was taken (a {size} {saved.dtype} "
                f"{'tensor' if saved.kind == 'torch' else 'array'}, kept in checkpoints by its fingerprint)"
            )

    def _value(self, entry: Entry, like: Any) -> Any:
        shared = self.aliases.get(entry.alias) if entry.alias is not None else None
        if shared is not None and type(shared) is (set if entry.kind == "set" else type(entry.value)):
            return shared  # held under several names: one object again (a crafted alias of
            # another kind of value gets its own object, of its own kind)
        new: Any = set(entry.value) if entry.kind == "set" else _placed(entry.value, like, entry.device)
        if entry.kind == "value" and type(new) in (list, dict):
            new = _fresh(new)
        if entry.alias is not None and shared is None:
            self.aliases[entry.alias] = new
        return new


def _fresh(value: Any) -> Any:
    """Containers of the checkpoint's decoded tree, made anew (tensors are not copied)."""
    if type(value) is list:
        return [_fresh(x) for x in value]
    if type(value) is dict:
        return {k: _fresh(x) for k, x in value.items()}
    if type(value) is tuple:
        return tuple(_fresh(x) for x in value)
    return value


def _placed(value: Any, like: Any, device: str | None) -> Any:
    """``value`` with its tensors on the device of the tensor it replaces, else on the one
    they were saved from when this machine has it (they load on the CPU)."""
    target = like.device if isinstance(like, torch.Tensor) else _device(device)
    if target is None:
        return value
    if isinstance(value, torch.Tensor):
        return value if value.device == target else value.to(target)
    if type(value) in (list, tuple):
        return type(value)(_placed(x, None, str(target)) for x in value)
    if type(value) is dict:
        return {k: _placed(x, None, str(target)) for k, x in value.items()}
    return value


def _device(name: str | None) -> torch.device | None:
    if name is None or not name.startswith("cuda"):
        return None
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        return None
    if not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count():
        return None
    return device


def _category(value: Any) -> str | None:
    """The kind of plain value ``value`` is; None for anything else."""
    if value is None:
        return "none"
    if isinstance(value, (bool, int, float, np.integer, np.floating, np.bool_)):
        return "number"
    if isinstance(value, np.generic) and value.dtype.kind == "c":
        return "number"
    for kind, types in (("str", str), ("tensor", torch.Tensor), ("array", np.ndarray)):
        if type(value) is types:
            return kind
    return type(value).__name__ if type(value) in (list, tuple, dict, set) else None


def _a(value: Any) -> str:
    t = type(value)
    return (
        "nothing"
        if value is _MISSING
        else f"a {t.__module__ + '.' if t.__module__ != 'builtins' else ''}{t.__qualname__}"
    )


# ---------------------------------------------------------------------- loops
def _position(frame: FrameType, slot: int, state: LoopState, chain: _Chain) -> str | None:
    """Put one loop's position back; why not, if it was not."""
    if state.kind.startswith("?"):
        return "its position is not captured, the loop starts over"
    live = stack.loop_iterators(frame) or {}
    it = live.get(slot)
    if it is None:
        return f"no loop's iterator at stack slot {slot} here, not written"
    why = _check(it, state, chain)
    if why is None:
        why = _apply(it, state)
    return why


def _check(it: Any, state: LoopState, chain: _Chain) -> str | None:
    kind = type(it).__name__
    if state.kind == LOADER:
        return (
            None
            if kind in ("TrackedIter", "FastForward") or loader_generator(it)
            else f"the loop iterates a {kind} now, not a DataLoader"
        )
    if state.kind == RANGE:
        return _check_range(it, state.at)
    if state.kind == GENERATOR and isinstance(state.at, int):
        return chain.generator(it, state.at)  # its frame holds its position: written there
    if kind != state.kind:
        return f"the loop iterates a {kind} now, not a {state.kind}"
    at = state.at
    if kind in ranges.KINDS and ranges.SKIPS:
        return "its position was saved as an index, which this Python cannot set: the loop starts over"
    if kind in POSITIONED or kind == REVERSED:
        if not isinstance(at, int):
            return None if at is None else f"a {kind} has no such position"
        reduced = it.__reduce__()
        length = len(reduced[1][0]) if reduced[1] else 0
        low, high = (-1, length - 1) if kind == REVERSED else (0, length)
        if not low <= at <= high:
            return f"position {at} is outside the {length} items it iterates now, not written"
        return None
    if kind == "enumerate" and isinstance(at, Enumerated):
        return _check(it.__reduce__()[1][0], at.inner, chain)
    if kind in ("zip", "map") and isinstance(at, tuple):
        args = it.__reduce__()[1]
        inners = args if kind == "zip" else args[1:]
        if len(inners) != len(at):
            return f"the {kind} draws from {len(inners)} iterators now, the checkpoint's from {len(at)}"
        return next((why for i, s in zip(inners, at, strict=True) if (why := _check(i, s, chain))), None)
    return f"a {kind} whose position does not match the checkpoint's"


def _check_range(it: Any, at: object) -> str | None:
    kind = type(it).__name__
    if kind not in ranges.KINDS:
        return f"the loop iterates a {kind} now, not a range"
    if not isinstance(at, int):
        return "a range has no such position"
    why = ranges.why_not(it, at)
    return None if why is None else f"{why}, not written"


def _apply(it: Any, state: LoopState) -> str | None:
    kind, at = type(it).__name__, state.at
    if state.kind == RANGE and isinstance(at, int):
        ranges.skip_to(it, at)
    elif (kind in POSITIONED or kind == REVERSED) and isinstance(at, int):
        it.__setstate__(at)
    elif kind == "enumerate" and isinstance(at, Enumerated):
        _apply(it.__reduce__()[1][0], at.inner)
        if not stack.set_enumerate_count(it, at.count):
            return "its enumerate count cannot be set on this Python"
    elif kind in ("zip", "map") and isinstance(at, tuple):
        args = it.__reduce__()[1]
        for inner, s in zip(args if kind == "zip" else args[1:], at, strict=True):
            _apply(inner, s)
    return None


# ---------------------------------------------------------------------- locals
def _write(frame: FrameType, namespace: dict[str, Any], updates: dict[str, Any], module: bool) -> None:
    if not updates:
        return
    if module or sys.version_info >= (3, 13):  # PEP 667: f_locals writes through
        for name, value in updates.items():
            frame.f_locals[name] = value
        return
    namespace.update(updates)
    ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))
