"""The training loop's frame state in a checkpoint (zero-code mode, ``ferry.frames``): its
typed form, and what a plain value is (the one test the capture and the parser share).

Frame state is untrusted input, like the manifest: the resumed process writes it into its
own running frames. So what ferry writes is declared here once (``Section`` and below),
the capture builds these types, and a checkpoint's section is parsed into them
(``frameparse.py``) before anything uses it: types, lengths, nesting, counts and
positions that are never negative, kinds from a closed set. What fails is refused whole, with the field named
(``CorruptCheckpointError``): ferry never writes such a section, so the checkpoint was
damaged or crafted. Whether a well-formed value fits the resumed process's frames (the
same code, a name that code defines, an attribute the object has, a position inside what
the loop iterates now) is checked where it is written (``autotrack/restore.py``).

On disk (the section's ``version`` is 2; a section without one was written by an earlier
ferry, and is not restored)::

    {"version": 2, "by": "loader" | "optimizer" | "forward", "model": str | null,
     "python": "3.11", "sampler": {attribute: scalar},
     "frames": [{"file", "qualname", "line", "code": hex digest, "names": [str],
                 "values": {name: entry}, "loops": [{"slot": int, "kind", "at"}],
                 "offset"?: int}]}
    entry:  {"value": plain, "alias"?: int, "device"?: str}
          | {"set": [scalar], "alias"?: int}
          | {"object": {attribute: entry}}
          | {"fingerprint": {"kind": "torch" | "numpy", "dtype", "shape": [int], "xxh3": hex}}
    at:     null | int | {"count": int, "inner": {"kind", "at"}} | {"inner": [{"kind", "at"}]}

A generator's frame (one that wraps the loader: it asked for the batch) has an ``offset``,
the instruction it was running; a loop over such a generator has the kind ``generator``
and, as ``at``, the index of that frame in ``frames``: its position is the frame's state.

A plain value is None, a bool, an int (up to 4096 bits), a float, a str (up to 4096
characters), a NumPy number, a torch tensor or NumPy array of numbers, or a list, tuple or
dict of plain values (dict keys: scalars or tuples of them), nested at most 8 deep and
100,000 items in all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

VERSION = 2
BY = ("loader", "optimizer", "forward")
POSITIONED = frozenset({"range_iterator", "longrange_iterator", "list_iterator", "tuple_iterator"})
"""Iterators whose position is an index from 0 to the length of what they iterate (ranges
were saved so before ferry kept them by their next value: ``RANGE``)."""
RANGE = "range"
"""A range's iterator, positioned by the next value it gives (autotrack/ranges.py: CPython
3.12 and later do not tell a range iterator's index)."""
REVERSED = "list_reverseiterator"
"""Its position is the next index from the end: from the length - 1 down to -1."""
WRAPPERS = frozenset({"enumerate", "zip", "map"})
LOADER = "loader"
"""A DataLoader's iterator: positioned by its tracker, nothing to set in the frame."""
GENERATOR = "generator"
"""A generator whose frame is one of the loop's frames (it wraps the loader): its position
is that frame's state, put back with it; ``at`` is the frame's index."""
MAX_FRAMES = 256
MAX_STR = 4096
MAX_INT_BITS = 4096
MAX_DEPTH = 8
MAX_ITEMS = 100_000
MAX_POSITION = 1 << 62
MAX_SLOT = 1 << 16
MAX_NAMES = 100_000
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
    offset: int | None = None
    """A generator's frame: the instruction it was running (its state is only valid there)."""

    def tree(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "qualname": self.qualname,
            "line": self.line,
            "code": self.code,
            "names": list(self.names),
            "values": {k: e.tree() for k, e in self.values.items()},
            "loops": [lp.tree() for lp in self.loops],
            **({} if self.offset is None else {"offset": self.offset}),
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
            if type(x) is float or x is None or type(x) is bool:  # a loss history: no call each
                budget[0] -= 1
            else:
                _plain(x, depth + 1, budget)
        if budget[0] < 0:
            raise FrameStateError("", f"holds more than {MAX_ITEMS} items")
        return
    if t is dict:
        for k, x in v.items():  # type: ignore[attr-defined]
            if not is_key(k):
                raise FrameStateError("", f"holds a dict key {got(k)}")
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


def got(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def is_name(raw: object) -> bool:
    """A name ferry keeps: an identifier, not a dunder (``__builtins__``) or private one."""
    return type(raw) is str and raw.isidentifier() and len(raw) <= 200 and not raw.startswith("__")
