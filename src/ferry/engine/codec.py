"""Live values to the on-disk format and back: torch's side of the state tree.

The format (ferry/format/, torch-free: names, tags, the checksum, decoding the tree) is a
JSON manifest describing a tree of values and raw tensor bytes. This module encodes a live
state (Stateful objects, tensors, arrays, plain values) into that tree, lays its tensors
out in a data file, and gives the leaves that decode into torch values. Nothing here can
execute code on load: the tree is JSON with a closed set of tags, and dtypes come from a
fixed table. See docs/format.md.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from ferry.errors import UnsafeCheckpointError, UnsupportedStateError
from ferry.format import wire
from ferry.format.wire import ALIGN, NUMPY_KINDS, Leaves
from ferry.knobs import WRITE_SMALL_BYTES

if TYPE_CHECKING:
    from ferry.format.manifest import TensorRecord


TORCH_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name) for name in wire.TORCH_ITEMSIZES if hasattr(torch, name)
}
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_DTYPE_IDS = {id(v): k for k, v in TORCH_DTYPES.items()}
"""DTYPE_NAMES by the dtype's identity (dtypes are singletons): hashing a torch.dtype costs
more than the rest of recording a tensor."""


def is_stateful(obj: object) -> bool:
    """The ``Stateful`` protocol: anything with ``state_dict`` and ``load_state_dict``."""
    return (
        callable(getattr(obj, "state_dict", None))
        and callable(getattr(obj, "load_state_dict", None))
        and not isinstance(obj, (dict, torch.Tensor))
    )


@dataclass(slots=True)
class TensorEntry:
    dtype: str
    shape: Sequence[int]
    """A torch.Size (a tuple) or a list."""
    nbytes: int
    kind: Literal["torch", "numpy"] = "torch"
    device: str = "cpu"
    file: str = "data-0.bin"
    offset: int = 0

    def to_json(self) -> TensorRecord:
        return {"dtype": self.dtype, "shape": list(self.shape), "nbytes": self.nbytes, "kind": self.kind,
                "device": self.device, "file": self.file, "offset": self.offset}  # fmt: skip


@dataclass
class Flattened:
    """A state tree split into a JSON skeleton and the arrays it refers to, by index."""

    tree: object
    """JSON: plain values and the tags below."""
    arrays: list[torch.Tensor | np.ndarray] = field(default_factory=list)
    entries: list[TensorEntry] = field(default_factory=list)


Path = tuple[object, ...]
"""Where a value sits in the state, as keys from the root: joined into a name only for an
error message (formatting one per value cost more than the rest of encoding it)."""


def _name(path: Path) -> str:
    return ".".join(str(k) for k in path)


def flatten(state: object) -> Flattened:
    """Encode ``state`` (Stateful objects, tensors, arrays, plain values) as a skeleton."""
    out = Flattened(tree=None)
    out.tree = _enc(state, out, ())
    return out


def _enc(v: Any, out: Flattened, path: Path) -> object:
    if isinstance(v, torch.Tensor):  # first: a big state is mostly tensors
        return {"__tensor__": _add_tensor(v, out, path, None)}
    if isinstance(v, np.generic) and v.dtype.kind in NUMPY_KINDS:  # np.float64 is a float too
        return {"__npscalar__": v.dtype.str, "value": _enc(v.item(), out, path)}
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return v if math.isfinite(v) else {"__float__": repr(v)}
    if isinstance(v, np.ndarray):
        return {"__ndarray__": _add_ndarray(v, out, path)}
    if isinstance(v, (bytes, bytearray)):
        return {"__bytes__": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, dict):
        if _plain_keys(v):
            # A tensor straight away, without a call of _enc (the commonest item by far).
            return {
                k: {"__tensor__": _add_tensor(x, out, path, k)}
                if isinstance(x, torch.Tensor)
                else _enc(x, out, (*path, k))
                for k, x in v.items()
            }
        return {"__dict__": [[_enc(k, out, path), _enc(x, out, (*path, k))]
                             for k, x in v.items()]}  # fmt: skip
    if isinstance(v, list):
        return _items(v, out, path)
    if isinstance(v, tuple):  # torch.Size is a tuple too
        return {"__tuple__": _items(v, out, path)}
    if isinstance(v, torch.dtype) and v in DTYPE_NAMES:
        return {"__dtype__": DTYPE_NAMES[v]}
    if isinstance(v, torch.device):
        return {"__device__": str(v)}
    if is_stateful(v):
        return {"__stateful__": type(v).__qualname__, "state": _enc(v.state_dict(), out, path)}
    raise UnsupportedStateError(
        f"cannot checkpoint {_name(path) or 'the state'} of type {type(v).__module__}."
        f"{type(v).__qualname__}: give it state_dict()/load_state_dict(), convert it to "
        "plain values, or save it through ferry's save_fn/restore_fn pair"
    )


def _items(v: list[Any] | tuple[Any, ...], out: Flattened, path: Path) -> list[object]:
    """The items of a list or tuple; ints, strings and finite floats as they are, without a
    call each (Python's RNG state is 625 ints, a loss history thousands of floats)."""
    return [
        x
        if (kind := type(x)) is int or kind is str or (kind is float and math.isfinite(x))
        else _enc(x, out, (*path, i))
        for i, x in enumerate(v)
    ]


def _plain_keys(d: dict[Any, Any]) -> bool:
    """Every key a string that does not start with ``__`` (the tags' mark): a skeleton
    object's own keys. Checked in C, by ``map`` and one joined string: a generator over
    the 20,000 keys of a state took a tenth of its save. A key holding ``\0__`` reads as
    tagged: its dict takes the general form, which encodes any key."""
    return all(map(isinstance, d, repeat(str))) and "\0__" not in "\0" + "\0".join(d)


def _add_tensor(t: torch.Tensor, out: Flattened, path: Path, key: object) -> int:
    """Record tensor ``t``, at ``path`` (then ``key``, unless None, a tuple per tensor
    being made only for an error message)."""
    name = _DTYPE_IDS.get(id(t.dtype))  # (quantized dtypes are not in the table)
    if name is None or t.layout is not torch.strided:
        where = path if key is None else (*path, key)
        raise UnsupportedStateError(
            f"cannot checkpoint tensor {_name(where)}: layout {t.layout}, dtype {t.dtype}; "
            "convert it to a dense tensor of a standard dtype first"
        )
    # The shape stays a torch.Size (a tuple): a list of it cost a tenth of a save per tensor.
    out.entries.append(TensorEntry(name, t.shape, t.nbytes, "torch", "cpu" if t.is_cpu else str(t.device)))
    out.arrays.append(t.detach() if t.requires_grad else t)  # detach costs a new tensor object
    return len(out.arrays) - 1


def _add_ndarray(a: np.ndarray, out: Flattened, path: Path) -> int:
    if a.dtype.kind not in NUMPY_KINDS:
        raise UnsupportedStateError(
            f"cannot checkpoint array {_name(path)} of dtype {a.dtype}: object and structured "
            "arrays could run code on load; store numbers only"
        )
    out.entries.append(TensorEntry(a.dtype.str, list(a.shape), a.nbytes, "numpy"))
    out.arrays.append(a)
    return len(out.arrays) - 1


def entries_json(entries: list[TensorEntry]) -> wire.RawJSON:
    """The manifest's ``tensors`` field: ``json.dumps([e.to_json() for e in entries],
    separators=(",", ":"))``, character for character (the manifest's checksum is over that
    form), formatted directly. json's encoder took 2 us a record, as long as the rest of a
    save's work per tensor. Every field's type is fixed by ``flatten``: strings (quoted by
    json itself, once per distinct one), ints and a list of ints, whose ``str`` is their
    JSON but for the spaces after commas. A record's text up to its offset is formatted
    once per distinct kind of tensor (20,000 optimizer states are a handful of kinds)."""
    texts = {e.dtype for e in entries} | {e.device for e in entries} | {e.file for e in entries}
    q = {text: json.dumps(text) for text in texts | {"torch", "numpy"}}
    heads: dict[tuple[object, ...], str] = {}

    def head(e: TensorEntry, key: tuple[object, ...]) -> str:
        text = heads[key] = (
            f'{{"dtype":{q[e.dtype]},"shape":{str(list(e.shape)).replace(" ", "")},"nbytes":{e.nbytes},'
            f'"kind":{q[e.kind]},"device":{q[e.device]},"file":{q[e.file]},"offset":'
        )
        return text

    known = heads.get
    body = "},".join(
        [
            (known(key := (e.dtype, e.nbytes, e.kind, e.device, e.file, *e.shape)) or head(e, key))
            + str(e.offset)
            for e in entries
        ]
    )
    return wire.RawJSON(f"[{body}}}]" if entries else "[]")


def layout(entries: list[TensorEntry], file: str = "data-0.bin") -> int:
    """Assign offsets in one data file; returns its size (a multiple of ``ALIGN``). Each
    tensor starts at a multiple of ``ALIGN``, but a small torch tensor right after a small
    one of its dtype starts where that one ends: a run of them is one block of bytes,
    copied and written by one call (engine/runs.py)."""
    offset = 0
    run: str | None = None  # the dtype of the run the next small tensor may join
    for e in entries:
        small = e.nbytes < WRITE_SMALL_BYTES and e.kind == "torch"
        if not small or e.dtype != run:
            offset = -(-offset // ALIGN) * ALIGN
        e.file, e.offset = file, offset
        offset += e.nbytes
        run = e.dtype if small else None
    return -(-offset // ALIGN) * ALIGN


# ---------------------------------------------------------------------------- decoding


def torch_dtype(name: object) -> torch.dtype:
    try:
        return TORCH_DTYPES[name]  # type: ignore[index]
    except (KeyError, TypeError):
        raise UnsafeCheckpointError(f"unknown tensor dtype {wire.short(name)} in manifest") from None


def device(name: object) -> torch.device:
    """A device string of the manifest (``cpu``, ``cuda:1``) as a ``torch.device``."""
    checked = wire.check_device(name)
    try:
        return torch.device(checked)
    except (RuntimeError, ValueError):
        raise UnsafeCheckpointError(f"unknown device {checked!r} in manifest") from None


def np_scalar(name: object, value: object) -> np.generic:
    """A numpy scalar of dtype ``name`` holding ``value``, checked to fit first."""
    dt = wire.check_np_scalar(name, value)
    with np.errstate(over="raise"):
        try:
            return dt.type(value)  # type: ignore[no-any-return]
        except (OverflowError, FloatingPointError):
            raise UnsafeCheckpointError(
                f"numpy scalar {wire.short(value)} does not fit dtype {dt.str}"
            ) from None


TORCH_LEAVES = Leaves(dtype=torch_dtype, device=device, npscalar=np_scalar)
"""The leaves of a loaded tree: torch dtypes and devices, numpy scalars."""


def unflatten(tree: object, arrays: Sequence[object]) -> Any:
    """Decode a skeleton into live values; ``arrays[i]`` replaces tensor index ``i``."""
    return wire.unflatten(tree, arrays, TORCH_LEAVES)
