"""What zero-code mode keeps of one value in the training loop's frames: a plain value
(copied), an object of the script's own classes (its attributes, each kept the same way),
a big array's fingerprint, or nothing, and then what it cannot keep is watched, to be named
when training changes it.

- Plain values (``state/framestate.py``): scalars, tensors and NumPy arrays, and lists,
  tuples, dicts and sets of those. Tensors that the tracked models and optimizers own are
  never copied (a local holding a parameter is an alias, not a value).
- Arrays and tensors over ``SMALL_BYTES`` are data more often than state (a corpus loaded
  at start-up): in a local or a global only their fingerprint is kept, and the resumed run's
  own copy is checked against it. Held by an object of the script's classes, such an array
  is kept whole when it changed since training started (the current shard of a token
  loader) and is at most ``ATTRIBUTE_BYTES``; otherwise its fingerprint is kept, and an
  array that changed but is bigger is named in a warning.
- Objects of the script's own classes (``own_kind``): their attributes, to a depth of
  ``MAX_OBJECT_DEPTH``. A class that derives from a library class (``nn.Module``) keeps its
  scalar attributes only: the rest is the library's.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import FunctionType, ModuleType
from typing import Any, Literal

import numpy as np
import torch
import xxhash
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ferry.state.framestate import MAX_DEPTH, MAX_ITEMS, Entry, Fingerprint, is_key, is_name, plain_problem
from ferry.state.usercode import is_user_file

SMALL_BYTES = 16 << 20
ATTRIBUTE_BYTES = 1 << 30
MAX_OBJECT_DEPTH = 4
_PLAIN_ONLY = (
    "keep plain values in it (numbers, strings, tensors, arrays, lists and dicts of those): "
    "zero-code mode captures those"
)
_NEVER_OWN = (DataLoader, Enum, BaseException, type, ModuleType, FunctionType)


@dataclass
class Problem:
    """Something in the loop's frames zero-code mode sees but cannot capture."""

    where: str
    what: str
    fix: str

    def line(self) -> str:
        return f"ferry: warning: {self.where}: {self.what}; to make it exact: {self.fix}"


@dataclass(frozen=True)
class Watched:
    """A value in the loop's frames that is not captured, by where it is: a signature that
    changes when it does, and how to say so."""

    where: str
    signature: int
    name: str
    what: str
    ident: int
    fix: str


def own_kind(value: object) -> Literal["own", "mixed"] | None:
    """ "own": an instance of a class of the user's code whose bases are all theirs too (or
    ``object``); "mixed": one that derives from a library class (its scalar attributes only
    are the script's); None: anything else (modules, classes, functions, library objects)."""
    if isinstance(value, _NEVER_OWN) or not hasattr(value, "__dict__"):
        return None
    kinds = [_class_is_user(c) for c in type(value).__mro__ if c is not object]
    if not kinds or not kinds[0]:
        return None
    return "own" if all(kinds) else "mixed"


def _class_is_user(cls: type) -> bool:
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    return isinstance(path, str) and is_user_file(path)


def nbytes(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.nbytes)
    return int(value.nbytes) if isinstance(value, np.ndarray) else 0


class Digests:
    """Fingerprints of big arrays, kept across checkpoints: a tensor whose storage, version
    counter and shape did not change is not read again (a dataset held on the GPU)."""

    def __init__(self) -> None:
        self._tensors: dict[int, tuple[tuple[object, ...], Fingerprint]] = {}

    def of(self, value: torch.Tensor | np.ndarray) -> Fingerprint:
        if isinstance(value, np.ndarray):
            data = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
            return Fingerprint(
                "numpy", value.dtype.str, tuple(value.shape), xxhash.xxh3_64_hexdigest(data.data)
            )
        key = (value.untyped_storage().data_ptr(), value._version, tuple(value.shape), value.stride(),
               value.dtype, value.device)  # fmt: skip
        known = self._tensors.get(id(value))
        if known is not None and known[0] == key:
            return known[1]
        host = value.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy()
        found = Fingerprint("torch", str(value.dtype).removeprefix("torch."), tuple(value.shape),
                            xxhash.xxh3_64_hexdigest(host.data))  # fmt: skip
        self._tensors[id(value)] = (key, found)
        return found


@dataclass
class Values:
    """One capture of the values in the loop's frames (``looking``: the first look, which
    copies nothing and only notes what is there)."""

    owned: set[int]
    """Ids and storage addresses of the tensors the tracked objects own."""
    tracked: set[int]
    """Ids of the objects ``ferry.track`` captures: left to it."""
    digests: Digests
    first: dict[str, Fingerprint] | None
    """The big arrays of the script's objects at the first look (None: this is it)."""
    looking: bool = False
    problems: list[Problem] = field(default_factory=list)
    watched: dict[str, Watched] = field(default_factory=dict)
    signatures: dict[str, int] = field(default_factory=dict)
    """Every container seen, captured or not, by where it is: what the watched ones are
    compared with (a list empty at the first look is a plain value, and captured, until
    training fills it with objects)."""
    big: dict[str, Fingerprint] = field(default_factory=dict)
    _aliases: dict[int, int] = field(default_factory=dict)
    _objects: set[int] = field(default_factory=set)

    def entry(
        self,
        value: Any,
        where: str,
        scope: str,
        name: str,
        *,
        depth: int = 0,
        module: bool = False,
        batches: bool = False,
    ) -> Entry | None:
        """What is kept of ``value``, found under ``name`` (dotted for an attribute) in a frame
        (``where``: as messages say it, with its line; ``scope``: the same for every safe
        point: file and function); None when nothing is. ``batches``: in a generator's frame
        (its locals: batches it holds), changed arrays are kept whole, library objects named."""
        kind = own_kind(value)
        if id(value) in self.tracked and kind != "mixed":  # a tracked model keeps its mode, say
            return None
        if type(value) in (list, dict, set, tuple):
            signature = _signature(value)
            if signature is not None:
                self.signatures[f"{scope}:{name}"] = signature
        if _big(value):
            try:
                return self._big(value, where, f"{scope}:{name}", name, depth=depth, batches=batches)
            except (RuntimeError, NotImplementedError):  # no bytes to read (a meta tensor)
                return None
        if type(value) is set:
            if len(value) <= 100_000 and all(is_key(x) for x in value):
                return Entry("set", set() if self.looking else set(value), alias=self._alias(value))
            self._watch(value, where, f"{scope}:{name}", name, depth, module, too_big=len(value) > 100_000)
            return None
        problem = plain_problem(value)
        if problem is None:
            if self._holds_owned(value):
                return None  # a parameter, or a list of them: the tracked objects' own state
            if sum(nbytes(t) for t in _arrays(value)) > (ATTRIBUTE_BYTES if batches else SMALL_BYTES):
                self._watch(value, where, f"{scope}:{name}", name, depth, module, too_big=True)
                return None
            alias = self._alias(value) if type(value) in (list, dict) else None
            return Entry("value", None if self.looking else _copy(value), alias=alias, device=_device(value))
        if kind is not None:
            if id(value) in self._objects or depth >= MAX_OBJECT_DEPTH:
                return None  # kept where first met (the frames hold one object: one restore)
            mixed = kind == "mixed"
            return self._object(value, where, scope, name, depth, scalars_only=mixed, batches=batches)
        if self._holds_owned(value):
            return None  # an optimizer's param group: the tracked objects' own state
        if batches and _holds_arrays(value):
            self.problems.append(_uncaptured_batch(value, where, name))
        self._watch(
            value,
            where,
            f"{scope}:{name}",
            name,
            depth,
            module,
            too_big=problem.startswith("holds more than"),
        )
        return None

    def _object(
        self, obj: Any, where: str, scope: str, name: str, depth: int, *, scalars_only: bool, batches: bool
    ) -> Entry:
        self._objects.add(id(obj))
        attrs = {}
        for attr, value in list(vars(obj).items()):
            if not is_name(attr):
                continue
            if scalars_only:
                if _scalar(value):
                    attrs[attr] = Entry("value", value)
                continue
            kept = self.entry(value, where, scope, f"{name}.{attr}", depth=depth + 1, batches=batches)
            if kept is not None:
                attrs[attr] = kept
        return Entry("object", attrs=attrs)

    def _big(
        self, value: torch.Tensor | np.ndarray, where: str, key: str, name: str, *, depth: int, batches: bool
    ) -> Entry:
        found = self.digests.of(value)
        self.big[key] = found
        changed = self.first is not None and self.first.get(key) != found
        if not (depth > 0 or batches) or not changed or self.looking:
            return Entry("fingerprint", fingerprint=found)
        if nbytes(value) <= ATTRIBUTE_BYTES:
            return Entry("value", _copy(value), device=_device(value))
        owner = name.split(".")[0]
        fix = (
            f"give the class of `{owner}` state_dict()/load_state_dict() methods that save and reload it, "
            f"and call `ferry.track({owner}={owner})`"
            if depth
            else "let the generator hold smaller batches, or iterate the DataLoader itself"
        )
        self.problems.append(Problem(
            f"{where}: `{name}`",
            f"a {nbytes(value) >> 20} MiB array that changed during training, too big for zero-code mode "
            f"to keep in every checkpoint (over {ATTRIBUTE_BYTES >> 20} MiB): after a resume it holds what "
            "the resumed run makes",
            fix,
        ))  # fmt: skip
        return Entry("fingerprint", fingerprint=found)

    def _holds_owned(self, value: Any) -> bool:
        """Does ``value`` hold a tensor the tracked objects own (or share storage with)?"""
        return any(
            isinstance(t, torch.Tensor) and (id(t) in self.owned or _storage(t) in self.owned)
            for t in _arrays(value)
        )

    def _alias(self, value: object) -> int:
        return self._aliases.setdefault(id(value), len(self._aliases))

    def _watch(
        self, value: Any, where: str, key: str, name: str, depth: int, module: bool, *, too_big: bool
    ) -> None:
        """Note a value that is not captured, to say so if training changes it."""
        signature = _signature(value)
        if signature is None:
            return
        owner = name.split(".")[0]
        if depth:
            what = "an attribute"
            fix = (f"give the class of `{owner}` state_dict()/load_state_dict() methods that cover "
                   f"`{name}`, and call `ferry.track({owner}={owner})`")  # fmt: skip
        else:
            what = "a global" if module else "a local"
            fix = f"`ferry.track({name}={name})`" if too_big else _PLAIN_ONLY
        self.watched[key] = Watched(f"{where}: `{name}`", signature, name, what, id(value), fix)


def _big(value: object) -> bool:
    if type(value) is np.ndarray:
        return value.nbytes > SMALL_BYTES and value.dtype.kind in "biufc"
    return type(value) is torch.Tensor and value.layout == torch.strided and value.nbytes > SMALL_BYTES


def _uncaptured_batch(value: object, where: str, name: str) -> Problem:
    return Problem(
        f"{where}: `{name}`",
        f"the generator holds a {_type_name(value)} with tensors in it, which zero-code mode cannot "
        "capture: a batch it holds ahead of training is not restored after a resume",
        "hold batches as tensors, or tuples, lists or dicts of them (zero-code mode captures those)",
    )


def _type_name(value: object) -> str:
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _holds_arrays(value: object, depth: int = 0) -> bool:
    """Does a library object hold tensors or arrays (in its items or attributes, two levels
    down, the first 16 of each)? A model, a dataset, a loader or its iterator (torch's,
    ferry's) is not a batch."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return True
    module = type(value).__module__.split(".")[0]
    if depth > 2 or module in ("torch", "ferry") or isinstance(value, (nn.Module, Dataset, str, bytes)):
        return False
    if isinstance(value, Mapping):
        items: Iterable[Any] = value.values()
    elif isinstance(value, Sequence):
        items = value
    else:
        items = getattr(value, "__dict__", {}).values()
    return any(_holds_arrays(x, depth + 1) for x in itertools.islice(items, 16))


def _scalar(value: object) -> bool:
    if type(value) in (list, dict, tuple, set, torch.Tensor, np.ndarray):
        return False
    return plain_problem(value) is None


def _signature(value: Any) -> int | None:
    """A hash that changes when a container's items do (by value for scalars, by identity
    for the rest); None for anything else (a library object is not watched)."""
    if isinstance(value, dict):
        items: list[Any] = [x for kv in value.items() for x in kv]
    elif isinstance(value, (list, set, tuple)):
        items = list(value)
    else:
        return None
    if len(items) > 1_000_000:
        return hash((type(value).__name__, len(items), id(value)))
    keys = [x if _scalar(x) else ("id", id(x)) for x in items]
    if isinstance(value, set):
        keys.sort(key=repr)
    try:
        return hash((type(value).__name__, tuple(keys)))
    except TypeError:
        return hash((type(value).__name__, len(items), id(value)))


def _arrays(value: Any, depth: int = 0) -> list[torch.Tensor | np.ndarray]:
    """The tensors and arrays in ``value`` (its lists, tuples and dicts, 8 deep at most: a
    list may hold itself)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return [value]
    if depth > MAX_DEPTH:
        return []
    if isinstance(value, dict):
        items = list(value.values())[:MAX_ITEMS]
    elif isinstance(value, (list, tuple)):
        items = list(value)[:MAX_ITEMS]
    else:
        return []
    # a list of numbers (a loss history) holds no arrays: its items are not looked into one by one
    return [a for x in items if type(x) not in _NO_ARRAYS for a in _arrays(x, depth + 1)]


_NO_ARRAYS = frozenset({int, float, bool, str, bytes, type(None)})


def _storage(t: torch.Tensor) -> int:
    with contextlib.suppress(RuntimeError, NotImplementedError):
        return int(t.untyped_storage().data_ptr())
    return -1


def _device(value: Any) -> str | None:
    found = next((t for t in _arrays(value) if isinstance(t, torch.Tensor)), None)
    return None if found is None or found.device.type == "cpu" else str(found.device)


def _copy(value: Any) -> Any:
    """A copy that training cannot change while the checkpoint is written."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone(memory_format=torch.contiguous_format)
    if isinstance(value, np.ndarray):
        return np.array(value, copy=True)
    if isinstance(value, list):
        return [_copy(x) for x in value]
    if isinstance(value, tuple):
        return tuple(_copy(x) for x in value)
    if isinstance(value, dict):
        return {k: _copy(x) for k, x in value.items()}
    return value
