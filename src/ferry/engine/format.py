"""The on-disk format: a JSON manifest describing a tree of values and raw tensor bytes.

Nothing here can execute code on load: the tree is JSON with a closed set of tags, and
dtypes come from a fixed table. See docs/format.md.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
import xxhash

from ferry.errors import UnsafeCheckpointError, UnsupportedStateError

if TYPE_CHECKING:  # manifest.py builds on this module
    from ferry.engine.manifest import TensorRecord

FORMAT_NAME = "ferry-checkpoint"
FORMAT_VERSION = 1
ALIGN = 64

TORCH_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in (
        "float64", "float32", "float16", "bfloat16", "complex64", "complex128",
        "int64", "int32", "int16", "int8", "uint8", "bool",
        "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2",
    )
    if hasattr(torch, name)
}  # fmt: skip
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
NUMPY_KINDS = set("biufc")  # bool, int, uint, float, complex: no object or void dtypes


def is_stateful(obj: object) -> bool:
    """The ``Stateful`` protocol: anything with ``state_dict`` and ``load_state_dict``."""
    return (
        callable(getattr(obj, "state_dict", None))
        and callable(getattr(obj, "load_state_dict", None))
        and not isinstance(obj, (dict, torch.Tensor))
    )


@dataclass
class TensorEntry:
    dtype: str
    shape: list[int]
    nbytes: int
    kind: Literal["torch", "numpy"] = "torch"
    device: str = "cpu"
    file: str = "data-0.bin"
    offset: int = 0

    def to_json(self) -> TensorRecord:
        return {"dtype": self.dtype, "shape": self.shape, "nbytes": self.nbytes, "kind": self.kind,
                "device": self.device, "file": self.file, "offset": self.offset}  # fmt: skip


@dataclass
class Flattened:
    """A state tree split into a JSON skeleton and the arrays it refers to, by index."""

    tree: object
    """JSON: plain values and the tags below."""
    arrays: list[torch.Tensor | np.ndarray] = field(default_factory=list)
    entries: list[TensorEntry] = field(default_factory=list)


def _path(parent: str, key: object) -> str:
    return f"{parent}.{key}" if parent else str(key)


def flatten(state: object) -> Flattened:
    """Encode ``state`` (Stateful objects, tensors, arrays, plain values) as a skeleton."""
    out = Flattened(tree=None)
    out.tree = _enc(state, out, "")
    return out


def _enc(v: Any, out: Flattened, path: str) -> object:
    if isinstance(v, np.generic) and v.dtype.kind in NUMPY_KINDS:  # np.float64 is a float too
        return {"__npscalar__": v.dtype.str, "value": _enc(v.item(), out, path)}
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return v if math.isfinite(v) else {"__float__": repr(v)}
    if isinstance(v, torch.Tensor):
        return {"__tensor__": _add_tensor(v, out, path)}
    if isinstance(v, np.ndarray):
        return {"__ndarray__": _add_ndarray(v, out, path)}
    if isinstance(v, (bytes, bytearray)):
        return {"__bytes__": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in v):
            return {k: _enc(x, out, _path(path, k)) for k, x in v.items()}
        return {"__dict__": [[_enc(k, out, path), _enc(x, out, _path(path, k))]
                             for k, x in v.items()]}  # fmt: skip
    if isinstance(v, list):
        return [_enc(x, out, _path(path, i)) for i, x in enumerate(v)]
    if isinstance(v, tuple):  # torch.Size is a tuple too
        return {"__tuple__": [_enc(x, out, _path(path, i)) for i, x in enumerate(v)]}
    if isinstance(v, torch.dtype) and v in DTYPE_NAMES:
        return {"__dtype__": DTYPE_NAMES[v]}
    if isinstance(v, torch.device):
        return {"__device__": str(v)}
    if is_stateful(v):
        return {"__stateful__": type(v).__qualname__, "state": _enc(v.state_dict(), out, path)}
    raise UnsupportedStateError(
        f"cannot checkpoint {path or 'the state'} of type {type(v).__module__}."
        f"{type(v).__qualname__}: give it state_dict()/load_state_dict(), convert it to "
        "plain values, or save it through ferry's save_fn/restore_fn pair"
    )


def _add_tensor(t: torch.Tensor, out: Flattened, path: str) -> int:
    if t.layout != torch.strided or t.is_quantized or t.dtype not in DTYPE_NAMES:
        raise UnsupportedStateError(
            f"cannot checkpoint tensor {path}: layout {t.layout}, dtype {t.dtype}; "
            "convert it to a dense tensor of a standard dtype first"
        )
    out.entries.append(TensorEntry(DTYPE_NAMES[t.dtype], list(t.shape),
                                   t.numel() * t.element_size(), "torch", str(t.device)))  # fmt: skip
    out.arrays.append(t.detach())
    return len(out.arrays) - 1


def _add_ndarray(a: np.ndarray, out: Flattened, path: str) -> int:
    if a.dtype.kind not in NUMPY_KINDS:
        raise UnsupportedStateError(
            f"cannot checkpoint array {path} of dtype {a.dtype}: object and structured "
            "arrays could run code on load; store numbers only"
        )
    out.entries.append(TensorEntry(a.dtype.str, list(a.shape), a.nbytes, "numpy"))
    out.arrays.append(a)
    return len(out.arrays) - 1


def layout(entries: list[TensorEntry], file: str = "data-0.bin") -> int:
    """Assign aligned offsets in one data file; returns the file size."""
    offset = 0
    for e in entries:
        e.file, e.offset = file, offset
        offset += -(-e.nbytes // ALIGN) * ALIGN if e.nbytes else 0
    return offset


# ---------------------------------------------------------------------------- decoding

_TAGS = {"__float__", "__tensor__", "__ndarray__", "__npscalar__", "__bytes__", "__dict__",
         "__tuple__", "__dtype__", "__device__", "__stateful__"}  # fmt: skip
_TAG_EXTRA = {"__npscalar__": ("value",), "__stateful__": ("state",)}
"""The keys a tagged object has besides its tag; it has no others."""


def unflatten(tree: object, arrays: Sequence[object]) -> Any:
    """Decode a skeleton; ``arrays[i]`` replaces tensor index ``i``."""
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return tree
    if isinstance(tree, list):
        return [unflatten(x, arrays) for x in tree]
    if not isinstance(tree, dict):
        raise UnsafeCheckpointError(f"unexpected JSON value {type(tree).__name__} in manifest")
    tags = [k for k in tree if k.startswith("__")]
    if not tags:
        return {k: unflatten(x, arrays) for k, x in tree.items()}
    tag = tags[0]
    if tag not in _TAGS:
        raise UnsafeCheckpointError(
            f"checkpoint manifest uses unknown tag {tag!r}; ferry loads only plain values and "
            "tensors and never runs code from a checkpoint: this file was not written by ferry"
        )
    if not set(tree) <= {tag, *_TAG_EXTRA.get(tag, ())}:  # what else reads the tree sees the same
        raise UnsafeCheckpointError(f"a {tag} object in the manifest has other keys: {_short(sorted(tree))}")
    val = tree[tag]
    if tag == "__float__":
        if val not in ("nan", "inf", "-inf"):
            raise UnsafeCheckpointError(f"bad float literal {val!r} in manifest")
        return float(val)
    if tag in ("__tensor__", "__ndarray__"):
        if type(val) is not int or not 0 <= val < len(arrays):
            raise UnsafeCheckpointError(f"manifest refers to missing tensor {_short(val)}")
        return arrays[val]
    if tag == "__npscalar__":
        return np_scalar(val, unflatten(tree["value"], arrays))
    if tag == "__bytes__":
        if not isinstance(val, str):
            raise UnsafeCheckpointError(f"bytes in manifest are not base64 text: {_short(val)}")
        return base64.b64decode(val, validate=True)
    if tag == "__dict__":
        if not isinstance(val, list) or not all(isinstance(p, list) and len(p) == 2 for p in val):
            raise UnsafeCheckpointError("a __dict__ in the manifest is not a list of [key, value] pairs")
        return {_hashable(unflatten(k, arrays)): unflatten(x, arrays) for k, x in val}
    if tag == "__tuple__":
        if not isinstance(val, list):
            raise UnsafeCheckpointError(f"a __tuple__ in the manifest is not a list: {_short(val)}")
        return tuple(unflatten(x, arrays) for x in val)
    if tag == "__dtype__":
        return torch_dtype(val)
    if tag == "__device__":
        return device(val)
    if not isinstance(val, str):  # __stateful__: a type name, a label only
        raise UnsafeCheckpointError(
            f"a __stateful__ type name in the manifest is not a string: {_short(val)}"
        )
    return unflatten(tree["state"], arrays)  # its state dict


def _short(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


_DEVICE = re.compile(r"[a-z][a-z0-9_]{0,31}(:[0-9]{1,6})?")


def device(name: object) -> torch.device:
    """A device string of the manifest (``cpu``, ``cuda:1``) as a ``torch.device``."""
    if not isinstance(name, str) or not _DEVICE.fullmatch(name):
        raise UnsafeCheckpointError(f"bad device {_short(name)} in manifest")
    try:
        return torch.device(name)
    except (RuntimeError, ValueError):
        raise UnsafeCheckpointError(f"unknown device {name!r} in manifest") from None


def np_scalar(name: object, value: object) -> np.generic:
    """A numpy scalar of dtype ``name`` holding ``value``, which must be a value of that
    dtype (a bool for bool, an integer in range for an integer type, a number for a float):
    nothing is converted, wrapped around or rounded to infinity."""
    dt = _safe_np_dtype(name)
    if dt.kind == "b":
        ok = isinstance(value, bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        ok = type(value) is int and int(info.min) <= value <= int(info.max)
    elif dt.kind == "f":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:  # complex scalars are not written (their item() is a Python complex)
        ok = False
    if not ok:
        raise UnsafeCheckpointError(f"numpy scalar {_short(value)} does not fit dtype {dt.str}")
    with np.errstate(over="raise"):
        try:
            return dt.type(value)  # type: ignore[no-any-return]
        except (OverflowError, FloatingPointError):
            raise UnsafeCheckpointError(f"numpy scalar {_short(value)} does not fit dtype {dt.str}") from None


def _hashable(k: object) -> object:
    if isinstance(k, list):
        raise UnsafeCheckpointError("manifest uses a list as a dict key")
    return k


def torch_dtype(name: object) -> torch.dtype:
    try:
        return TORCH_DTYPES[name]  # type: ignore[index]
    except (KeyError, TypeError):
        raise UnsafeCheckpointError(f"unknown tensor dtype {_short(name)} in manifest") from None


_NP_DTYPE = re.compile(r"[<>|=]?[biufc][0-9]{1,2}")


def _safe_np_dtype(name: object) -> np.dtype[Any]:
    """Only the short dtype strings numpy writes for numbers (``<f8``, ``|b1``): no
    structured, sub-array, object or string dtypes, whatever ``np.dtype`` would accept."""
    if not isinstance(name, str) or not _NP_DTYPE.fullmatch(name):
        raise UnsafeCheckpointError(
            f"unknown array dtype {_short(name)} in manifest: not a number type (<f8, |b1); refused"
        )
    try:
        dt = np.dtype(name)
    except (TypeError, ValueError):
        raise UnsafeCheckpointError(f"unknown array dtype {name!r} in manifest") from None
    if dt.kind not in NUMPY_KINDS:
        raise UnsafeCheckpointError(f"array dtype {name!r} is not a number type; refused")
    return dt


# ---------------------------------------------------------------------------- manifest


def manifest_checksum(body: Mapping[str, object]) -> str:
    """xxh3-64 of the manifest without its checksum, serialized compactly, keys in order."""
    canon = json.dumps(body, separators=(",", ":"))  # key order kept: state dicts are ordered
    return str(xxhash.xxh3_64_hexdigest(canon.encode()))


def manifest_bytes(body: Mapping[str, object]) -> bytes:
    """Serialize with a checksum over the canonical body, so a damaged manifest is caught."""
    doc = dict(body, checksum=manifest_checksum(body))
    return json.dumps(doc, indent=1).encode()
