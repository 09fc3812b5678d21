"""The plain Python state of the training loop: captured at a checkpoint, put back at the
restore point of the resumed process, in the same frames (``restore.py``).

The loop's frames are those of the user's code (``state/usercode.py``: the script, its
own packages, wherever they are imported from) on the call stack of the safe point (the
frame asking for a batch, stepping the optimizer or calling the model, and its callers).
Of each one ferry keeps (``values.py``):

- its locals (a module's globals) that are plain values: scalars, tensors, arrays, lists,
  tuples, dicts and sets of those; a big array by its fingerprint;
- the attributes of objects of the script's own classes held in them (``self.iter_num``,
  ``self.tokens`` of a token loader, ``self.history``), nested objects of its classes too;
- the position of each iterator its ``for`` loops drive (``range``, ``enumerate``, list
  and tuple iterators, ``zip``/``map`` over those), read from the value stack
  (``stack.py``). A DataLoader's iterator is positioned by its tracker. A generator that
  wraps the loader (timm's prefetcher, a transform per batch) is running at the safe point,
  so its frame is one of the loop's frames: its position is that frame's state (its
  locals, the batches it holds ahead among them, and the instruction it runs), and a loop
  over it is put back with it.

Each frame is recorded with the digest of its code (``codeid.py``): a frame of the resumed
process that runs other code is not written into. What ferry sees but cannot capture (a
generator driving a loop, a list of objects that training appends to) is reported, naming
the file and line and the line of the explicit API that fixes it.
"""

from __future__ import annotations

import inspect
import os
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from torch.utils.data import DataLoader

from ferry.autotrack import codeid, ranges, stack
from ferry.autotrack.values import Problem, Values, Watched
from ferry.state.framestate import (
    GENERATOR,
    LOADER,
    MAX_POSITION,
    POSITIONED,
    RANGE,
    REVERSED,
    Entry,
    Enumerated,
    Fingerprint,
    Frame,
    Loop,
    LoopState,
)
from ferry.state.usercode import user_frames

_FERRY_ITERS = {"TrackedIter", "FastForward"}


def loop_frames(start: FrameType | None) -> list[FrameType]:
    """The frames of the user's code from ``start`` outwards, outermost first."""
    return user_frames(start)


def where(frame: FrameType) -> str:
    code = frame.f_code
    name = getattr(code, "co_qualname", code.co_name)
    return f"{os.path.basename(code.co_filename)}:{frame.f_lineno} (in {name})"


def key(frame: FrameType) -> tuple[str, str, int]:
    code = frame.f_code
    return (code.co_filename, getattr(code, "co_qualname", code.co_name), code.co_firstlineno)


def is_module(frame: FrameType) -> bool:
    return frame.f_code.co_name == "<module>"


def is_generator(frame: FrameType) -> bool:
    """Is ``frame`` a generator's (its state is only valid at the instruction it runs)?"""
    return bool(frame.f_code.co_flags & inspect.CO_GENERATOR)


def names_of(frame: FrameType) -> tuple[str, ...]:
    return codeid.defined_names(frame.f_code, is_module(frame))


@dataclass
class Captured:
    frames: list[Frame]
    """The loop's frames' state, outermost first."""
    problems: list[Problem] = field(default_factory=list)
    """What could not be captured."""
    watched: dict[str, Watched] = field(default_factory=dict)
    """What is not captured, by where it is: a change to one between two checkpoints is
    reported (``LoopKeeper``)."""
    big: dict[str, Fingerprint] = field(default_factory=dict)
    """The big arrays seen, by where they are."""
    signatures: dict[str, int] = field(default_factory=dict)
    """Every container seen, by where it is."""


def capture(frames: list[FrameType], values: Values) -> Captured:
    """The state of ``frames`` (from ``loop_frames``), through ``values``."""
    chain = {id(frame): i for i, frame in enumerate(frames)}
    out = [_frame_state(frame, values, chain) for frame in frames]
    return Captured(out, values.problems, values.watched, values.big, values.signatures)


def _frame_state(frame: FrameType, values: Values, chain: dict[int, int]) -> Frame:
    module, generator = is_module(frame), is_generator(frame)
    defined = names_of(frame)
    namespace = frame.f_globals if module else frame.f_locals
    kept: dict[str, Entry] = {}
    here, scope = where(frame), "{}:{}".format(*key(frame)[:2])
    for name in defined:
        if name not in namespace:
            continue
        # a generator's locals are the batches it holds: an array that changes is kept whole
        entry = values.entry(namespace[name], here, scope, name, module=module, batches=generator)
        if entry is not None:
            kept[name] = entry
    code = frame.f_code
    return Frame(
        file=code.co_filename,
        qualname=getattr(code, "co_qualname", code.co_name),
        line=code.co_firstlineno,
        code=codeid.digest(code),
        names=defined,
        values=kept,
        loops=_loops(frame, values.problems, chain),
        offset=stack.instruction(frame) if generator else None,
    )


def _loops(frame: FrameType, problems: list[Problem], chain: dict[int, int]) -> tuple[Loop, ...]:
    live = stack.loop_iterators(frame)
    if live is None and stack.inside_loops(frame):
        problems.append(
            Problem(
                where(frame),
                f"this Python ({sys.implementation.name} {sys.version_info.major}."
                f"{sys.version_info.minor}) gives ferry no access to a running loop's iterator, so "
                "`for` loops here restart after a resume (CPython 3.11 to 3.13 is needed)",
                "count steps with `ferry.global_step` instead of a loop counter",
            )
        )
    loops = []
    for slot, value in sorted((live or {}).items()):
        state = loop_state(value, chain)
        loops.append(Loop(slot, state))
        bad = unsupported(state)
        if bad:
            problems.append(
                Problem(
                    where(frame),
                    f"a `for` loop iterates a {bad}, whose position zero-code mode cannot read: "
                    "after a resume it starts over",
                    "iterate a DataLoader or a range, or skip what `ferry.global_step` says is done",
                )
            )
    return tuple(loops)


def loop_state(it: Any, chain: dict[int, int] | None = None) -> LoopState:
    """An iterator's kind and position (``LoopState``); ``chain``: the loop's frames (by id:
    their index), where a generator that wraps the loader runs."""
    kind = type(it).__name__
    if kind in _FERRY_ITERS:
        return LoopState(LOADER, None)
    frame = getattr(it, "gi_frame", None) if inspect.isgenerator(it) else None
    if frame is not None and chain is not None and id(frame) in chain:
        return LoopState(GENERATOR, chain[id(frame)])
    if loader_generator(it):
        return LoopState(LOADER, None)
    if kind in ranges.KINDS:
        value = ranges.next_value(it)
        return LoopState(RANGE, value) if abs(value) <= MAX_POSITION else LoopState("?" + kind, None)
    if kind in POSITIONED or kind == REVERSED:
        reduced = it.__reduce__()
        at = int(reduced[2]) if len(reduced) > 2 else None
        if at is not None and at > MAX_POSITION:  # beyond 2**62: its position is not kept
            return LoopState("?" + kind, None)
        return LoopState(kind, at)
    if kind == "enumerate":
        inner, count = it.__reduce__()[1]
        if not 0 <= count <= MAX_POSITION:
            return LoopState("?" + kind, None)
        return LoopState(kind, Enumerated(int(count), loop_state(inner, chain)))
    if kind in ("zip", "map"):
        args = it.__reduce__()[1]
        inners = args if kind == "zip" else args[1:]
        return LoopState(kind, tuple(loop_state(i, chain) for i in inners))
    return LoopState("?" + kind, None)


def loader_generator(it: Any) -> bool:
    """Is ``it`` the generator of a DataLoader subclass's own ``__iter__`` in a library
    (accelerate's ``DataLoaderShard``, which holds one batch ahead)? Its loader's tracker
    positions it, as it does a DataLoader's iterator; the batch it holds is fetched again."""
    frame = getattr(it, "gi_frame", None) if inspect.isgenerator(it) else None
    if frame is None or frame.f_code.co_name != "__iter__":
        return False
    owner = frame.f_locals.get("self")
    return isinstance(owner, DataLoader)


def unsupported(state: LoopState) -> str | None:
    """The kind of the first iterator in ``state`` whose position is not captured."""
    if state.kind.startswith("?"):
        return state.kind[1:]
    at = state.at
    inners = (at.inner,) if isinstance(at, Enumerated) else at if isinstance(at, tuple) else ()
    return next((found for inner in inners if (found := unsupported(inner))), None)


def mismatch(saved: tuple[Frame, ...], frames: list[FrameType], saved_python: str) -> str | None:
    """Why ``frames`` (the resumed process's) are not the frames ``saved`` was taken in:
    another chain of functions, or a function whose code changed."""
    if len(saved) != len(frames):
        return (
            f"the checkpoint's loop ran in {len(saved)} frames of the script, "
            f"the resumed one in {len(frames)}"
        )
    for state, frame in zip(saved, frames, strict=True):
        code = frame.f_code
        if (state.file, state.qualname, state.line) != key(frame):
            return (
                f"{os.path.basename(state.file)}:{state.line} ({state.qualname}) was saved where "
                f"{where(frame)} runs now (the script changed, or the loop is reached another way)"
            )
        if state.code != codeid.digest(code):
            changed = codeid.what_changed(state.names, names_of(frame), saved_python)
            return f"{where(frame)}: {changed}"
    return None
