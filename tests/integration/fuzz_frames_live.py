"""The frame-state fuzzer's view of the live frames (fuzz_frames.py): what every name, every
attribute of the script's objects and every loop position holds, how to put all of it
back as it was before a restore, and the verdict on one restore.

A snapshot maps each field (frame index and name, dotted for an attribute; ``loop:SLOT``
for a loop's iterator) to a canonical value: type-tagged, tensors and arrays by their
bytes, other objects by identity. The verdict on a restore compares, field by field, the
snapshot before any restore (``pre``) and after the mutated restore (``after``) with what
the mutated section says (``given``):

- unchanged from ``pre``: fine, unless the section gave another value: then a ferry line
  must name the field (or say the whole loop was not restored), else it is ``silent``;
- the section's value: written as given, which must keep the rules of docs/zero-code.md
  (never over a module, a model or another non-plain value; an attribute keeps its kind;
  a position within what the loop iterates); else ``wrong``;
- anything else: ``wrong``.
"""

from __future__ import annotations

import ctypes
import sys
from types import FrameType
from typing import Any

import numpy as np
import torch
import xxhash

from ferry.autotrack import codeid, stack
from ferry.autotrack.frames import loop_state
from ferry.autotrack.values import own_kind
from ferry.state.framestate import POSITIONED, REVERSED, Entry, Section

UNBOUND = ("unbound",)
OBJECT = -1
"""The frame index of the fields of an object's attributes: (OBJECT, "ID.ATTR")."""
Field = tuple[int, str]


def canon(value: Any, depth: int = 0) -> Any:
    """A comparable stand-in for ``value``."""
    if isinstance(value, torch.Tensor):
        data = value.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return ("tensor", str(value.dtype), tuple(value.shape), xxhash.xxh3_64_hexdigest(data))
    if isinstance(value, np.ndarray):
        digest = xxhash.xxh3_64_hexdigest(np.ascontiguousarray(value).data)
        return ("array", value.dtype.str, value.shape, digest)
    if depth > 10:
        return ("deep",)
    if type(value) in (list, tuple):
        return (type(value).__name__, tuple(canon(v, depth + 1) for v in value))
    if type(value) is dict:
        return ("dict", tuple((canon(k), canon(v, depth + 1)) for k, v in value.items()))
    if type(value) in (set, frozenset):
        return (type(value).__name__, tuple(sorted(repr(canon(v)) for v in value)))
    if value is None or type(value) in (bool, int, float, str) or isinstance(value, np.generic):
        return (type(value).__name__, repr(value))
    return ("obj", type(value).__qualname__, id(value))


def kind(c: Any) -> str:
    """The kind of plain value a canonical value stands for ('obj' for the rest)."""
    if c == UNBOUND:
        return "unbound"
    name = c[0]
    if name in ("bool", "int", "float", "int64", "float64", "float32", "int32", "bool_"):
        return "number"
    return "none" if name == "NoneType" else name


class Live:
    """The user's frames at the restore point: snapshots, and a reset to how they were."""

    def __init__(self, frames: list[FrameType]) -> None:
        self.frames = frames
        self.names = [codeid.defined_names(f.f_code, _module(f)) for f in frames]
        spaces = zip(self.names, self._spaces(), strict=True)
        self.pre_names = [{n: ns[n] for n in names if n in ns} for names, ns in spaces]
        self.objects: dict[int, tuple[Any, dict[str, Any]]] = {}
        for values in self.pre_names:
            for v in values.values():
                self._note(v, 0)
        self.iterators = [dict(stack.loop_iterators(f) or {}) for f in frames]
        self.positions = [{s: _position(it) for s, it in its.items()} for its in self.iterators]

    def _spaces(self) -> list[dict[str, Any]]:
        return [f.f_globals if _module(f) else f.f_locals for f in self.frames]

    def _note(self, value: Any, depth: int) -> None:
        if depth > 4 or own_kind(value) is None or id(value) in self.objects:
            return
        self.objects[id(value)] = (value, dict(vars(value)))
        for v in list(vars(value).values()):
            self._note(v, depth + 1)

    def snapshot(self) -> dict[Field, Any]:
        out: dict[Field, Any] = {}
        for fi, (names, ns) in enumerate(zip(self.names, self._spaces(), strict=True)):
            for name in names:
                value = ns.get(name, UNBOUND) if name in ns else UNBOUND
                out[(fi, name)] = UNBOUND if value is UNBOUND else canon(value)
            for slot, it in (stack.loop_iterators(self.frames[fi]) or {}).items():
                out[(fi, f"loop:{slot}")] = repr(loop_state(it))
        for obj, _ in self.objects.values():  # an object's attributes once, by the object
            for attr, v in list(vars(obj).items()):
                out[(OBJECT, f"{id(obj)}.{attr}")] = canon(v)
        return out

    def reset(self) -> None:
        """Everything back as before the first restore: names (bound or not), the objects'
        attributes, the loops' positions."""
        for frame, names, pre in zip(self.frames, self.names, self.pre_names, strict=True):
            ns = frame.f_globals if _module(frame) else frame.f_locals
            for name in names:
                if name in pre:
                    ns[name] = pre[name]
                else:
                    ns.pop(name, None)
            if not _module(frame):
                ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(1))
        for obj, attrs in self.objects.values():
            vars(obj).clear()
            vars(obj).update(attrs)
        for its, positions in zip(self.iterators, self.positions, strict=True):
            for slot, it in its.items():
                _set_position(it, positions[slot])


def _module(frame: FrameType) -> bool:
    return frame.f_code.co_name == "<module>"


def _position(it: Any) -> Any:
    kind_ = type(it).__name__
    if kind_ == "enumerate":
        inner, count = it.__reduce__()[1]
        return ("enumerate", count, inner, _position(inner))
    if kind_ in ("zip", "map"):
        args = it.__reduce__()[1]
        inners = args if kind_ == "zip" else args[1:]
        return (kind_, [(i, _position(i)) for i in inners])
    if kind_ not in POSITIONED and kind_ != REVERSED:
        return (kind_, None)  # a loader's iterator: its tracker positions it, not the frame
    reduced = it.__reduce__()
    return (kind_, reduced[2] if len(reduced) > 2 else None)


def _set_position(it: Any, position: Any) -> None:
    if position[0] == "enumerate":
        _, count, inner, inner_position = position
        _set_position(inner, inner_position)
        assert stack.set_enumerate_count(it, count)
    elif position[0] in ("zip", "map"):
        for inner, inner_position in position[1]:
            _set_position(inner, inner_position)
    elif position[1] is not None:
        it.__setstate__(position[1])


# ---------------------------------------------------------------------- the verdict
class Given:
    """What a section says each field holds (several values for containers that share an
    alias: the first one met is restored for all), which fields are attributes, and how
    ferry's lines name each field."""

    def __init__(self, section: Section, view: Live) -> None:
        self.values: dict[Field, set[Any]] = {}
        self.attributes: set[Field] = set()
        self.labels: dict[Field, set[str]] = {}
        aliases: dict[int, list[Field]] = {}
        for fi, frame in enumerate(section.frames):
            for name, entry in frame.values.items():
                live = view.pre_names[fi].get(name) if fi < len(view.pre_names) else None
                self._entry((fi, name), name, entry, live, aliases)
            for loop in frame.loops:
                if loop.state.kind != "loader" and not loop.state.kind.startswith("?"):
                    field = (fi, f"loop:{loop.slot}")
                    self.values.setdefault(field, set()).add(repr(loop.state))
                    self.labels.setdefault(field, set()).add("loops[")
        for fields in aliases.values():
            shared = set().union(*(self.values[f] for f in fields))
            for f in fields:
                self.values[f] = shared

    def _entry(
        self, field: Field, label: str, entry: Entry, live: Any, aliases: dict[int, list[Field]]
    ) -> None:
        self.labels.setdefault(field, set()).add(f"`{label}`")
        if entry.kind == "object":
            if own_kind(live) is None:
                return  # not an object of the script's now: the restore refuses it whole
            for attr, sub in entry.attrs.items():
                at = (OBJECT, f"{id(live)}.{attr}")
                self.attributes.add(at)
                self._entry(at, f"{label}.{attr}", sub, vars(live).get(attr), aliases)
        elif entry.kind in ("value", "set"):
            value = set(entry.value) if entry.kind == "set" else entry.value
            self.values.setdefault(field, set()).add(canon(value))
            if entry.alias is not None:
                aliases.setdefault(entry.alias, []).append(field)


def verdict(pre: dict[Field, Any], after: dict[Field, Any], said: list[str], section: Section | None,
            view: Live) -> list[str]:  # fmt: skip
    """What is wrong with a restore that left ``after`` (empty: nothing)."""
    bad = [f"not a ferry line: {line[:200]}" for line in said if not line.startswith("ferry: ")]
    whole = any("counters and positions are not restored" in line for line in said)
    known = Given(section, view) if section is not None else None
    values = known.values if known is not None else {}
    for field in sorted(set(pre) | set(after) | set(values), key=repr):
        a, p, g = after.get(field, UNBOUND), pre.get(field, UNBOUND), values.get(field)
        if a == p:
            labels = known.labels.get(field, set()) if known is not None else set()
            if g is not None and p not in g and not whole and not any(m in ln for m in labels for ln in said):
                bad.append(f"silent: {field} {sorted(labels)} not written and not said")
        elif g is not None and a in g:
            attribute = known is not None and field in known.attributes
            why = _rule(field, p, a, attribute, view.frames)
            if why:
                bad.append(f"wrong: {field} written against the rules: {why}")
        else:
            bad.append(f"wrong: {field} holds {str(a)[:80]}, neither {str(p)[:80]} nor the checkpoint's")
    return bad


def _rule(field: Field, pre: Any, new: Any, attribute: bool, frames: list[FrameType]) -> str | None:
    name = field[1]
    if name.startswith("loop:"):
        it = (stack.loop_iterators(frames[field[0]]) or {}).get(int(name[5:]))
        return None if it is None or _within(it) else f"a position outside what the loop iterates: {new}"
    if kind(pre) == "obj":
        return f"over a non-plain value {pre}"
    if attribute:
        if pre == UNBOUND:
            return "an attribute the object did not have"
        if kind(pre) != kind(new) and "none" not in (kind(pre), kind(new)):
            return f"a {kind(new)} over a {kind(pre)}"
    elif field[0] != OBJECT:
        frame = frames[field[0]]
        if name not in codeid.defined_names(frame.f_code, _module(frame)):
            return "a name the code does not define"
    return None


def _within(it: Any) -> bool:
    if type(it).__name__ == "enumerate":
        inner, count = it.__reduce__()[1]
        return bool(count >= 0 and _within(inner))
    if type(it).__name__ in ("zip", "map"):
        args = it.__reduce__()[1]
        return all(_within(i) for i in (args if type(it).__name__ == "zip" else args[1:]))
    if type(it).__name__ not in POSITIONED and type(it).__name__ != REVERSED:
        return True  # a loader's: its tracker positions it
    reduced = it.__reduce__()
    if len(reduced) < 3 or not reduced[1]:
        return True  # exhausted
    length = len(reduced[1][0])
    low = -1 if type(it).__name__ == "list_reverseiterator" else 0
    return bool(low <= reduced[2] <= length)


def same_modules(before: dict[str, dict[str, int]]) -> list[str]:
    """Modules whose attributes changed since ``before`` (``module_ids()``)."""
    now = module_ids(list(before))
    return [m for m in before if now[m] != before[m]]


def module_ids(names: list[str]) -> dict[str, dict[str, int]]:
    return {m: {k: id(v) for k, v in vars(sys.modules[m]).items()} for m in names if m in sys.modules}
