"""The training loop's frame state in a checkpoint (zero-code mode, ``ferry.frames``): its
typed form, and the one parser that checks a checkpoint's section against it.

Frame state is untrusted input, like the manifest: the resumed process writes it into its
own running frames. So what ferry writes is declared here once (``Section`` and below),
the capture builds these types, and a checkpoint's section is parsed into them before
anything uses it: types, lengths, nesting, counts and positions that are never negative,
kinds from a closed set. What fails is refused whole, with the field named
(``CorruptCheckpointError``): ferry never writes such a section, so the checkpoint was
damaged or crafted. Whether a well-formed value fits the resumed process's frames (the
same code, a name that code defines, an attribute the object has, a position inside what
the loop iterates now) is checked where it is written (``autotrack/restore.py``).

On disk (the section's ``version`` is 2; a section without one was written by an earlier
ferry, and is not restored)::

    {"version": 2, "by": "loader" | "optimizer" | "forward", "model": str | null,
     "python": "3.11", "sampler": {attribute: scalar},
     "frames": [{"file", "qualname", "line", "code": hex digest, "names": [str],
                 "values": {name: entry}, "loops": [{"slot": int, "kind", "at"}]}]}
    entry:  {"value": plain, "alias"?: int, "device"?: str}
          | {"set": [scalar], "alias"?: int}
          | {"object": {attribute: entry}}
          | {"fingerprint": {"kind": "torch" | "numpy", "dtype", "shape": [int], "xxh3": hex}}
    at:     null | int | {"count": int, "inner": {"kind", "at"}} | {"inner": [{"kind", "at"}]}

A plain value is None, a bool, an int (up to 4096 bits), a float, a str (up to 4096
characters), a NumPy number, a torch tensor or NumPy array of numbers, or a list, tuple or
dict of plain values (dict keys: scalars or tuples of them), nested at most 8 deep and
100,000 items in all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from ferry.errors import CorruptCheckpointError

VERSION = 2
BY = ("loader", "optimizer", "forward")
POSITIONED = frozenset({"range_iterator", "longrange_iterator", "list_iterator", "tuple_iterator"})
"""Iterators whose position is an index from 0 to the length of what they iterate."""
REVERSED = "list_reverseiterator"
"""Its position is the next index from the end: from the length - 1 down to -1."""
WRAPPERS = frozenset({"enumerate", "zip", "map"})
LOADER = "loader"
"""A DataLoader's iterator: positioned by its tracker, nothing to set in the frame."""
MAX_FRAMES = 256
MAX_STR = 4096
MAX_INT_BITS = 4096
MAX_DEPTH = 8
MAX_ITEMS = 100_000
MAX_POSITION = 1 << 62
MAX_SLOT = 1 << 16
MAX_NAMES = 100_000
_UNKNOWN_KIND = re.compile(r"\?[A-Za-z_][A-Za-z0-9_.]{0,200}\Z")
_HEX = re.compile(r"[0-9a-f]{16}\Z")
NUMPY_KINDS = frozenset("biufc")
PRIMITIVES = (type(None), bool, int, float, str)


class FrameStateError(ValueError):
    """A frames section that ferry never writes; the message names the field."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


# ---------------------------------------------------------------------- the types
@dataclass(frozen=True)
class Fingerprint:
    """A big array kept by its digest, not its bytes: the resumed process's own copy is
    checked against it."""

    kind: Literal["torch", "numpy"]
    dtype: str
    shape: tuple[int, ...]
    digest: str

    def tree(self) -> dict[str, Any]:
        return {"kind": self.kind, "dtype": self.dtype, "shape": list(self.shape), "xxh3": self.digest}


@dataclass(frozen=True)
class Entry:
    """What a name held: a plain value (rebound), a set, an object of the script's own
    classes (its attributes set in place), or a big array's fingerprint."""

    kind: Literal["value", "set", "object", "fingerprint"]
    value: Any = None
    attrs: Mapping[str, Entry] = field(default_factory=dict)
    alias: int | None = None
    """Containers held under several names share a number: restored as one object."""
    device: str | None = None
    """Where the value's tensors were (they load on the CPU)."""
    fingerprint: Fingerprint | None = None

    def tree(self) -> dict[str, Any]:
        if self.kind == "object":
            return {"object": {k: e.tree() for k, e in self.attrs.items()}}
        if self.kind == "fingerprint" and self.fingerprint is not None:
            return {"fingerprint": self.fingerprint.tree()}
        out: dict[str, Any] = {self.kind: sorted(self.value, key=repr) if self.kind == "set" else self.value}
        if self.alias is not None:
            out["alias"] = self.alias
        if self.device is not None:
            out["device"] = self.device
        return out


@dataclass(frozen=True)
class Enumerated:
    count: int
    inner: LoopState


@dataclass(frozen=True)
class LoopState:
    """An iterator's kind and position: an index, an enumerate's count and what it wraps,
    the iterators a zip or map draws from; None for a loader's or an unknown kind."""

    kind: str
    at: int | Enumerated | tuple[LoopState, ...] | None

    def tree(self) -> dict[str, Any]:
        at: Any = self.at
        if isinstance(at, Enumerated):
            at = {"count": at.count, "inner": at.inner.tree()}
        elif isinstance(at, tuple):
            at = {"inner": [s.tree() for s in at]}
        return {"kind": self.kind, "at": at}


@dataclass(frozen=True)
class Loop:
    slot: int
    """Where the iterator is on the frame's value stack."""
    state: LoopState

    def tree(self) -> dict[str, Any]:
        return {"slot": self.slot, **self.state.tree()}


@dataclass(frozen=True)
class Frame:
    file: str
    qualname: str
    line: int
    code: str
    """A digest of the frame's code (``autotrack/codeid.py``): its bytecode and names."""
    names: tuple[str, ...]
    """The names the code defines (locals; a module's globals)."""
    values: Mapping[str, Entry]
    loops: tuple[Loop, ...]

    def tree(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "qualname": self.qualname,
            "line": self.line,
            "code": self.code,
            "names": list(self.names),
            "values": {k: e.tree() for k, e in self.values.items()},
            "loops": [lp.tree() for lp in self.loops],
        }


@dataclass(frozen=True)
class Section:
    by: str
    model: str | None
    python: str
    sampler: Mapping[str, Any]
    frames: tuple[Frame, ...]

    def tree(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "by": self.by,
            "model": self.model,
            "python": self.python,
            "sampler": dict(self.sampler),
            "frames": [f.tree() for f in self.frames],
        }


@dataclass(frozen=True)
class Legacy:
    """A section written by an earlier ferry, which did not record the frames' code."""

    by: str


# ---------------------------------------------------------------------- checks
def parse(raw: object, where: str) -> Section | Legacy:
    """The frames section of the checkpoint at ``where``, checked; CorruptCheckpointError
    naming the field otherwise."""
    try:
        return _section(raw)
    except FrameStateError as exc:
        raise CorruptCheckpointError(
            f"{where}: the loop's frame state, ferry.frames{exc.path}, {exc.why}: ferry never writes "
            "that, so the checkpoint is damaged or was crafted; resume from an older checkpoint "
            "(move this one away) or start fresh in another --dir"
        ) from None


def _section(raw: object) -> Section | Legacy:
    d = _dict(raw, "", {"version", "by", "model", "python", "sampler", "frames"})
    by = d.get("by", "loader")
    if by not in BY:
        raise FrameStateError(".by", f"is {_got(by)}, not one of {', '.join(BY)}")
    if "version" not in d:
        return Legacy(str(by))
    if type(d["version"]) is not int or d["version"] != VERSION:
        raise FrameStateError(".version", f"is {_got(d['version'])}, not {VERSION}")
    model = d.get("model")
    if model is not None:
        _str(model, ".model")
    python = _str(d.get("python"), ".python", 16)
    sampler = _dict(d.get("sampler", {}), ".sampler")
    for name, value in sampler.items():
        _name(name, f".sampler.{name}")
        if type(value) not in PRIMITIVES or not is_plain(value):
            raise FrameStateError(f".sampler.{name}", f"is {_got(value)}, not a scalar")
    frames = _list(d.get("frames"), ".frames", MAX_FRAMES)
    return Section(
        str(by), model, python, sampler, tuple(_frame(f, f".frames[{i}]") for i, f in enumerate(frames))
    )


def _frame(raw: object, path: str) -> Frame:
    d = _dict(raw, path, {"file", "qualname", "line", "code", "names", "values", "loops"}, required=True)
    line = d["line"]
    if type(line) is not int or not 0 <= line <= MAX_POSITION:
        raise FrameStateError(f"{path}.line", f"is {_got(line)}, not a line number")
    code = _str(d["code"], f"{path}.code", 16)
    if not _HEX.match(code):
        raise FrameStateError(f"{path}.code", f"is {_got(code)}, not a 16-digit digest")
    names = _list(d["names"], f"{path}.names", MAX_NAMES)
    for i, n in enumerate(names):
        _name(n, f"{path}.names[{i}]")
    values = {k: _entry(v, f"{path}.values.{_name(k, f'{path}.values')}", 0)
              for k, v in _dict(d["values"], f"{path}.values").items()}  # fmt: skip
    loops = _list(d["loops"], f"{path}.loops", 256)
    return Frame(
        _str(d["file"], f"{path}.file"),
        _str(d["qualname"], f"{path}.qualname"),
        line,
        code,
        tuple(names),
        values,
        tuple(_loop(x, f"{path}.loops[{i}]") for i, x in enumerate(loops)),
    )


def _entry(raw: object, path: str, depth: int) -> Entry:
    d = _dict(raw, path, {"value", "set", "object", "fingerprint", "alias", "device"})
    kinds = [k for k in ("value", "set", "object", "fingerprint") if k in d]
    if len(kinds) != 1:
        raise FrameStateError(path, "is not exactly one of a value, a set, an object or a fingerprint")
    kind = kinds[0]
    alias, device = d.get("alias"), d.get("device")
    if alias is not None and (type(alias) is not int or not 0 <= alias < MAX_ITEMS):
        raise FrameStateError(f"{path}.alias", f"is {_got(alias)}, not a small count")
    if device is not None:
        _str(device, f"{path}.device", 64)
    if kind == "object":
        if depth >= MAX_DEPTH or alias is not None or device is not None:
            raise FrameStateError(path, "nests objects too deep, or has an alias or device")
        attrs = _dict(d["object"], f"{path}.object")
        return Entry(
            "object", attrs={k: _entry(v, f"{path}.{_name(k, path)}", depth + 1) for k, v in attrs.items()}
        )
    if kind == "fingerprint":
        return Entry("fingerprint", fingerprint=_fingerprint(d["fingerprint"], f"{path}.fingerprint"))
    if kind == "set":
        items = _list(d["set"], f"{path}.set", MAX_ITEMS)
        for i, item in enumerate(items):
            if not is_key(item):
                raise FrameStateError(f"{path}.set[{i}]", f"is {_got(item)}, not a scalar")
        return Entry("set", frozenset(items), alias=alias)
    why = plain_problem(d["value"])
    if why is not None:
        raise FrameStateError(f"{path}.value", why)
    if alias is not None and type(d["value"]) not in (list, dict):
        raise FrameStateError(f"{path}.alias", "is given for a value that is not a list or dict")
    return Entry("value", d["value"], alias=alias, device=device)


def _fingerprint(raw: object, path: str) -> Fingerprint:
    d = _dict(raw, path, {"kind", "dtype", "shape", "xxh3"}, required=True)
    if d["kind"] not in ("torch", "numpy"):
        raise FrameStateError(f"{path}.kind", f"is {_got(d['kind'])}, not torch or numpy")
    shape = _list(d["shape"], f"{path}.shape", 64)
    if not all(type(n) is int and 0 <= n <= MAX_POSITION for n in shape):
        raise FrameStateError(f"{path}.shape", "is not a list of sizes")
    digest = _str(d["xxh3"], f"{path}.xxh3", 16)
    if not _HEX.match(digest):
        raise FrameStateError(f"{path}.xxh3", f"is {_got(digest)}, not a 16-digit digest")
    return Fingerprint(d["kind"], _str(d["dtype"], f"{path}.dtype", 32), tuple(shape), digest)


def _loop(raw: object, path: str) -> Loop:
    d = _dict(raw, path, {"slot", "kind", "at"}, required=True)
    slot = d["slot"]
    if type(slot) is not int or not 0 <= slot < MAX_SLOT:
        raise FrameStateError(f"{path}.slot", f"is {_got(slot)}, not a stack slot")
    return Loop(slot, _loop_state(d, path, 0))


def _loop_state(d: dict[str, Any], path: str, depth: int) -> LoopState:
    kind, at = d["kind"], d["at"]
    if not isinstance(kind, str) or not (kind in POSITIONED or kind in WRAPPERS or kind in (REVERSED, LOADER)
                                         or _UNKNOWN_KIND.match(kind)):  # fmt: skip
        raise FrameStateError(f"{path}.kind", f"is {_got(kind)}, not an iterator ferry positions")
    if depth > MAX_DEPTH:
        raise FrameStateError(path, "nests iterators too deep")
    if kind in POSITIONED or kind == REVERSED:
        low = -1 if kind == REVERSED else 0
        if at is not None and (type(at) is not int or not low <= at <= MAX_POSITION):
            raise FrameStateError(f"{path}.at", f"is {_got(at)}, not a position from {low}")
        return LoopState(kind, at)
    if kind == "enumerate":
        e = _dict(at, f"{path}.at", {"count", "inner"}, required=True)
        if type(e["count"]) is not int or not 0 <= e["count"] <= MAX_POSITION:
            raise FrameStateError(f"{path}.at.count", f"is {_got(e['count'])}, not a count from 0")
        return LoopState(kind, Enumerated(e["count"], _inner(e["inner"], f"{path}.at.inner", depth)))
    if kind in WRAPPERS:
        z = _dict(at, f"{path}.at", {"inner"}, required=True)
        inners = _list(z["inner"], f"{path}.at.inner", 64)
        return LoopState(kind, tuple(_inner(x, f"{path}.at.inner[{i}]", depth) for i, x in enumerate(inners)))
    if at is not None:
        raise FrameStateError(f"{path}.at", f"is {_got(at)}, but a {kind.lstrip('?')} has no position")
    return LoopState(kind, None)


def _inner(raw: object, path: str, depth: int) -> LoopState:
    return _loop_state(_dict(raw, path, {"kind", "at"}, required=True), path, depth + 1)


# ---------------------------------------------------------------------- plain values
def is_plain(value: object) -> bool:
    return plain_problem(value) is None


def plain_problem(value: object) -> str | None:
    """Why ``value`` is not a plain value (None when it is): the one test the capture and
    the parser share."""
    budget = [MAX_ITEMS]
    try:
        _plain(value, 0, budget)
    except FrameStateError as exc:
        return exc.why
    return None


def _plain(v: object, depth: int, budget: list[int]) -> None:
    budget[0] -= 1
    if budget[0] < 0:
        raise FrameStateError("", f"holds more than {MAX_ITEMS} items")
    t = type(v)
    if t is str:
        if len(v) > MAX_STR:  # type: ignore[arg-type]
            raise FrameStateError("", f"holds a string over {MAX_STR} characters")
        return
    if t is int:
        if v.bit_length() > MAX_INT_BITS:  # type: ignore[attr-defined]
            raise FrameStateError("", f"holds an integer over {MAX_INT_BITS} bits")
        return
    if t in PRIMITIVES or (isinstance(v, np.generic) and v.dtype.kind in NUMPY_KINDS):
        return
    if t is torch.Tensor:
        if v.layout != torch.strided or v.is_quantized:  # type: ignore[attr-defined]
            raise FrameStateError("", "holds a sparse or quantized tensor")
        return
    if t is np.ndarray:
        if v.dtype.kind not in NUMPY_KINDS:  # type: ignore[attr-defined]
            raise FrameStateError("", f"holds a NumPy array of {v.dtype}")  # type: ignore[attr-defined]
        return
    if depth >= MAX_DEPTH:
        raise FrameStateError("", f"nests containers more than {MAX_DEPTH} deep")
    if t is list or t is tuple:
        for x in v:  # type: ignore[attr-defined]
            _plain(x, depth + 1, budget)
        return
    if t is dict:
        for k, x in v.items():  # type: ignore[attr-defined]
            if not is_key(k):
                raise FrameStateError("", f"holds a dict key {_got(k)}")
            budget[0] -= 1
            _plain(x, depth + 1, budget)
        return
    raise FrameStateError("", f"holds a {t.__module__}.{t.__qualname__}")


def is_key(value: object) -> bool:
    """A dict key or set item ferry keeps: a scalar, or a short tuple of scalars."""
    if type(value) is tuple:
        return len(value) <= 16 and all(type(x) is not tuple and is_key(x) for x in value)
    if type(value) is str:
        return len(value) <= MAX_STR
    if type(value) is int:
        return value.bit_length() <= MAX_INT_BITS
    return type(value) in PRIMITIVES or (isinstance(value, np.generic) and value.dtype.kind in NUMPY_KINDS)


# ---------------------------------------------------------------------- helpers
def _got(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _dict(raw: object, path: str, keys: set[str] | None = None, *, required: bool = False) -> dict[str, Any]:
    if type(raw) is not dict:
        raise FrameStateError(path, f"is {_got(raw)}, not an object")
    if len(raw) > MAX_ITEMS or not all(type(k) is str for k in raw):
        raise FrameStateError(path, "has keys that are not names, or too many")
    if keys is not None:
        extra = set(raw) - keys
        if extra:
            raise FrameStateError(path, f"has fields ferry does not write: {', '.join(sorted(extra)[:5])}")
        if required and set(raw) != keys:
            raise FrameStateError(path, f"lacks {', '.join(sorted(keys - set(raw)))}")
    return raw


def _list(raw: object, path: str, limit: int) -> list[Any]:
    if type(raw) is not list:
        raise FrameStateError(path, f"is {_got(raw)}, not a list")
    if len(raw) > limit:
        raise FrameStateError(path, f"has {len(raw)} items, more than {limit}")
    return raw


def _str(raw: object, path: str, limit: int = MAX_STR) -> str:
    if type(raw) is not str or len(raw) > limit:
        raise FrameStateError(path, f"is {_got(raw)}, not a string of up to {limit} characters")
    return raw


def is_name(raw: object) -> bool:
    """A name ferry keeps: an identifier, not a dunder (``__builtins__``) or private one."""
    return type(raw) is str and raw.isidentifier() and len(raw) <= 200 and not raw.startswith("__")


def _name(raw: object, path: str) -> str:
    if not is_name(raw):
        raise FrameStateError(path, f"has {_got(raw)}, which is not a name ferry keeps")
    return str(raw)
