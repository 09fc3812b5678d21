"""The plain Python state of the training loop: captured at a checkpoint, put back at the
restore point of the resumed process, in the same frames.

The loop's frames are those of the script's own files on the call stack of the safe point
(the frame asking for a batch, stepping the optimizer or calling the model, and its
callers up to the script's module). Of each one ferry keeps:

- its plain locals: int, float, bool, str, None and small tuples of those, and tensors
  that are neither parameters nor big (a carried RNN state, the batch in hand);
- the scalar attributes of objects of the script's own classes held in them
  (``self.iter_num`` of a Trainer);
- the position of each iterator its ``for`` loops drive (``range``, ``enumerate``, list
  and tuple iterators, ``zip``/``map`` over those), read from the value stack
  (``autotrack/stack.py``). A DataLoader's iterator is positioned by its tracker.

Frames are matched between the two processes by code (file, qualified name, first line)
and depth; ferry refuses to restore into a frame that does not match and says so. What it
sees but cannot capture (a generator driving a loop, a list that training appends to) is
reported once, naming the file and line and the line of the explicit API that fixes it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from functools import cache
from types import FrameType
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from ferry.autotrack import stack
from ferry.errors import bug

log = logging.getLogger("ferry")
_SCALARS = (int, float, bool, str, type(None), np.integer, np.floating, np.bool_)
_MAX_STR = 4096
_MAX_TUPLE = 8
_MAX_TENSOR_BYTES = 16 << 20
"""Bigger tensors in the loop's frames are taken for data the script loads the same way
again (a tokenized corpus), not for state; they are left as the resumed run made them."""
_POSITIONED = {
    "range_iterator",
    "longrange_iterator",
    "list_iterator",
    "tuple_iterator",
    "list_reverseiterator",
}
_WRAPPERS = {"enumerate", "zip", "map"}
_FERRY_ITERS = {"TrackedIter", "_FastForward"}
_FERRY_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _user_root() -> str | None:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.dirname(os.path.realpath(path)) if path else None


@cache
def _is_user_file(filename: str, root: str) -> bool:
    """A file of the script: under the script's folder, not a library or ferry itself."""
    if filename.startswith("<"):
        return False
    path = os.path.realpath(filename)
    if not path.startswith(root + os.sep) or path.startswith(_FERRY_DIR + os.sep):
        return False
    parts = path.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    stdlib = sysconfig.get_paths().get("stdlib")
    return not (stdlib and path.startswith(os.path.realpath(stdlib) + os.sep))


def _key(frame: FrameType) -> tuple[str, str, int]:
    code = frame.f_code
    return (code.co_filename, getattr(code, "co_qualname", code.co_name), code.co_firstlineno)


def loop_frames(start: FrameType | None, root: str | None = None) -> list[FrameType]:
    """The script's frames from ``start`` up to its module frame, outermost first; the
    script's files are those under ``root`` (by default the folder of ``__main__``)."""
    root = root or _user_root()
    frames: list[FrameType] = []
    frame = start
    while frame is not None and root is not None:
        if _is_user_file(frame.f_code.co_filename, root):
            frames.append(frame)
        frame = frame.f_back
    return frames[::-1]


def _where(frame: FrameType) -> str:
    code = frame.f_code
    name = getattr(code, "co_qualname", code.co_name)
    return f"{os.path.basename(code.co_filename)}:{frame.f_lineno} (in {name})"


def _scalar(value: Any) -> bool:
    if isinstance(value, str):
        return len(value) <= _MAX_STR
    if isinstance(value, tuple):
        return len(value) <= _MAX_TUPLE and all(type(v) is not tuple and _scalar(v) for v in value)
    return type(value) in _SCALARS or isinstance(value, (np.integer, np.floating, np.bool_))


def _tensor_like(value: Any, params: set[int]) -> bool:
    """A tensor (or a small tuple of tensors) ferry may copy and rebind: not a parameter,
    not sharing a parameter's storage, not big."""
    if isinstance(value, tuple):
        return 0 < len(value) <= _MAX_TUPLE and all(_tensor_like(v, params) for v in value)
    if type(value) is not torch.Tensor:
        return False
    if value.is_sparse or value.nbytes > _MAX_TENSOR_BYTES:
        return False
    try:
        storage = value.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return False
    return id(value) not in params and storage not in params


def _copy(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_copy(v) for v in value)
    if isinstance(value, torch.Tensor):
        return value.detach().clone(memory_format=torch.contiguous_format)
    return value


def _own_class(value: Any, root: str) -> bool:
    if isinstance(value, DataLoader):  # a loader's position is its tracker's; the rest is its setup
        return False
    module = sys.modules.get(type(value).__module__)
    path = getattr(module, "__file__", None)
    return bool(path) and _is_user_file(path, root) and hasattr(value, "__dict__")


def plain_attributes(obj: Any) -> dict[str, Any]:
    """The plain values in an object's ``__dict__``."""
    return {k: v for k, v in getattr(obj, "__dict__", {}).items() if _scalar(v)}


def _position(it: Any) -> Any:
    """A picklable position of a supported iterator; None when it has none to restore."""
    kind = type(it).__name__
    if kind in _POSITIONED:
        reduced = it.__reduce__()
        return int(reduced[2]) if len(reduced) > 2 else None
    if kind == "enumerate":
        inner, count = it.__reduce__()[1]
        return {"count": int(count), "inner": _loop_state(inner)}
    if kind in ("zip", "map"):
        args = it.__reduce__()[1]
        inners = args if kind == "zip" else args[1:]
        return {"inner": [_loop_state(i) for i in inners]}
    return None


def _loop_state(it: Any) -> dict[str, Any]:
    kind = type(it).__name__
    if kind in _FERRY_ITERS:
        return {"kind": "loader"}
    if kind in _POSITIONED or kind in _WRAPPERS:
        return {"kind": kind, "at": _position(it)}
    return {"kind": "?" + kind}


def _unsupported(state: dict[str, Any]) -> str | None:
    """The kind of the first iterator in ``state`` whose position is not captured."""
    kind = str(state["kind"])
    if kind.startswith("?"):
        return kind[1:]
    at = state.get("at")
    inners = at.get("inner") if isinstance(at, dict) else None
    for inner in [inners] if isinstance(inners, dict) else (inners or []):
        found = _unsupported(inner)
        if found:
            return found
    return None


@dataclass
class Problem:
    """Something in the loop's frames zero-code mode sees but cannot capture."""

    where: str
    what: str
    fix: str

    def line(self) -> str:
        return f"ferry: warning: {self.where}: {self.what}; to make it exact: {self.fix}"


@dataclass
class _Seen:
    problems: list[Problem] = field(default_factory=list)
    containers: dict[str, tuple[int, str, str, int]] = field(default_factory=dict)
    """Lists and dicts of plain values in the loop's frames: where -> (fingerprint, name,
    kind of name, id of the value)."""


@dataclass
class Captured:
    frames: list[dict[str, Any]]
    """The loop's frames' plain state, outermost first."""
    problems: list[Problem]
    """What could not be captured."""
    containers: dict[str, tuple[int, str, str, int]]
    """Lists and dicts of plain values the frames hold, which are not captured: a change to
    one between two checkpoints is reported (``LoopKeeper``)."""


def capture(start: FrameType | None, params: set[int], root: str | None = None) -> Captured:
    root = root or _user_root()
    seen = _Seen()
    frames = []
    for frame in loop_frames(start, root):
        if root is None:
            raise bug("loop frames without the script's module frame")
        frames.append(_frame_state(frame, root, params, seen))
    return Captured(frames, seen.problems, seen.containers)


def _fingerprint(value: Any) -> int | None:
    """A hash of a list, set or dict of plain values; None for anything else."""
    if isinstance(value, dict):
        items: Any = value.items()
        flat = [x for kv in items for x in kv]
    elif isinstance(value, (list, set)):
        flat = list(value)
    else:
        return None
    if len(flat) > 100_000 or not all(_scalar(x) for x in flat):
        return None
    try:
        return hash((type(value).__name__, tuple(sorted(flat, key=repr) if isinstance(value, set) else flat)))
    except TypeError:
        return None


def _watch(seen: _Seen, where: str, value: Any, name: str, kind: str) -> None:
    print_ = _fingerprint(value)
    if print_ is not None:
        seen.containers[where] = (print_, name, kind, id(value))


def _frame_state(frame: FrameType, root: str, params: set[int], seen: _Seen) -> dict[str, Any]:
    module = frame.f_code.co_name == "<module>"
    names = frame.f_globals if module else frame.f_locals
    values: dict[str, Any] = {}
    tensors: dict[str, Any] = {}
    attrs: dict[str, dict[str, Any]] = {}
    for name, value in list(names.items()):
        if name.startswith("__"):
            continue
        where = f"{_where(frame)}: `{name}`"
        if _scalar(value):
            values[name] = value
        elif _tensor_like(value, params):
            tensors[name] = _copy(value)
        elif _own_class(value, root):
            attrs[name] = {k: v for k, v in vars(value).items() if _scalar(v)}
            for attr, v in vars(value).items():
                _watch(seen, f"{where[:-1]}.{attr}`", v, f"{name}.{attr}", "an attribute")
        else:
            _watch(seen, where, value, name, "a global" if module else "a local")
    loops: list[dict[str, Any]] = []
    live = stack.loop_iterators(frame)
    if live is None and stack.inside_loops(frame):
        seen.problems.append(
            Problem(
                _where(frame),
                f"this Python ({sys.implementation.name} {sys.version_info.major}."
                f"{sys.version_info.minor}) gives ferry no access to a running loop's iterator, so "
                "`for` loops here restart after a resume (CPython 3.11 to 3.13 is needed)",
                "count steps with `ferry.global_step` instead of a loop counter",
            )
        )
    for slot, value in sorted((live or {}).items()):
        state = _loop_state(value)
        state["slot"] = slot
        loops.append(state)
        bad = _unsupported(state)
        if bad:
            seen.problems.append(
                Problem(
                    _where(frame),
                    f"a `for` loop iterates a {bad}, whose position zero-code mode cannot read: "
                    "after a resume it starts over",
                    "iterate a DataLoader or a range, or skip what `ferry.global_step` says is done",
                )
            )
    key = _key(frame)
    return {
        "file": key[0],
        "qualname": key[1],
        "line": key[2],
        "locals": values,
        "tensors": tensors,
        "attrs": attrs,
        "loops": loops,
    }


# ---------------------------------------------------------------------- restore
def mismatch(saved: list[dict[str, Any]], frames: list[FrameType]) -> str | None:
    """Why ``frames`` (the resumed process's) are not the frames ``saved`` was taken in."""
    if len(saved) != len(frames):
        return (
            f"the checkpoint's loop ran in {len(saved)} frames of the script, "
            f"the resumed one in {len(frames)}"
        )
    for state, frame in zip(saved, frames, strict=True):
        if (state["file"], state["qualname"], state["line"]) != _key(frame):
            return (
                f"{os.path.basename(state['file'])}:{state['line']} ({state['qualname']}) was saved where "
                f"{_where(frame)} runs now (the script changed, or the loop is reached another way)"
            )
    return None


def restore(saved: list[dict[str, Any]], frames: list[FrameType]) -> tuple[dict[int, Any], list[str]]:
    """Put ``saved`` back into ``frames``; returns {id of a replaced value: its new value}
    (to swap arguments already taken from the old ones) and what could not be restored."""
    swapped: dict[int, Any] = {}
    failed: list[str] = []
    for state, frame in zip(saved, frames, strict=True):
        failed += _restore_loops(state["loops"], frame)
        module = frame.f_code.co_name == "<module>"
        names = frame.f_globals if module else frame.f_locals
        updates: dict[str, Any] = dict(state["locals"])
        for name, value in state.get("tensors", {}).items():
            old = names.get(name)
            new = _placed(value, old)
            if old is not None:
                swapped[id(old)] = new
            updates[name] = new
        for name, values in state["attrs"].items():
            obj = names.get(name)
            if obj is None or not hasattr(obj, "__dict__"):
                failed.append(f"{_where(frame)}: `{name}` is gone, its attributes are not restored")
                continue
            for attr, value in values.items():
                try:
                    setattr(obj, attr, value)
                except Exception as exc:  # a property without a setter, a class that refuses
                    failed.append(f"{_where(frame)}: `{name}.{attr}` cannot be set back ({exc})")
        _write_locals(frame, names, updates, module)
    return swapped, failed


def _placed(value: Any, like: Any) -> Any:
    """The saved tensor on the device of the value it replaces."""
    if isinstance(value, tuple):
        likes = like if isinstance(like, tuple) and len(like) == len(value) else (None,) * len(value)
        return tuple(_placed(v, lk) for v, lk in zip(value, likes, strict=True))
    if isinstance(value, torch.Tensor) and isinstance(like, torch.Tensor) and like.device != value.device:
        return value.to(like.device)
    return value


def _write_locals(frame: FrameType, names: dict[str, Any], updates: dict[str, Any], module: bool) -> None:
    if module or sys.version_info >= (3, 13):  # PEP 667: f_locals writes through
        for name, value in updates.items():
            frame.f_locals[name] = value
        return
    names.update(updates)
    ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))


def _restore_loops(saved: list[dict[str, Any]], frame: FrameType) -> list[str]:
    if not saved:
        return []
    live = stack.loop_iterators(frame) or {}
    failed = []
    for state in saved:
        it = live.get(int(state["slot"]))
        if it is None or not _set(it, state):
            failed.append(f"{_where(frame)}: the position of its {state['kind'].lstrip('?')} loop")
    return failed


def _set(it: Any, state: dict[str, Any]) -> bool:
    kind = type(it).__name__
    if kind in _FERRY_ITERS:
        return bool(state["kind"] == "loader")
    at = state.get("at")
    if kind != state["kind"] or (kind in _WRAPPERS and not isinstance(at, dict)):
        return False
    if kind in _POSITIONED:
        if at is not None:
            it.__setstate__(at)
        return True
    if not isinstance(at, dict):
        raise bug(f"a saved {kind} position of type {type(at).__name__}")
    if kind == "enumerate":
        inner = it.__reduce__()[1][0]
        return _set(inner, at["inner"]) and stack.set_enumerate_count(it, int(at["count"]))
    if kind in ("zip", "map"):
        args = it.__reduce__()[1]
        inners = args if kind == "zip" else args[1:]
        return len(inners) == len(at["inner"]) and all(
            _set(i, s) for i, s in zip(inners, at["inner"], strict=True)
        )
    return False


def chain(frames: list[FrameType]) -> list[tuple[str, str, int]]:
    return [_key(f) for f in frames]
