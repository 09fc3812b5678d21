"""The torch-free half of the on-disk format: names, the dtype table, the manifest checksum
and the decoding of the state tree.

``ferry inspect`` and ``ferry verify`` read manifests and checksums only; keeping this
module (and manifest.py, integrity.py) free of torch lets them start in a tenth of a second.
engine/codec.py builds on it with the torch half: encoding, and the leaves that are torch values.
numpy is imported only when a manifest names a numpy dtype.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

import xxhash

from ferry.errors import UnsafeCheckpointError

if TYPE_CHECKING:
    import numpy as np

FORMAT_NAME = "ferry-checkpoint"
FORMAT_VERSION = 1
ALIGN = 64

TORCH_ITEMSIZES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex64": 8, "complex128": 16,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "uint16": 2, "uint32": 4, "uint64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip
"""Every torch dtype the format names, with its size in bytes (a unit test checks them
against torch). A name this torch lacks is refused when loading, by engine/codec.torch_dtype."""
NUMPY_KINDS = set("biufc")  # bool, int, uint, float, complex: no object or void dtypes


def short(v: object) -> str:
    """A value of the manifest, cut short for a one-line message."""
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def torch_itemsize(name: object) -> int:
    try:
        return TORCH_ITEMSIZES[name]  # type: ignore[index]
    except (KeyError, TypeError):
        raise UnsafeCheckpointError(f"unknown tensor dtype {short(name)} in manifest") from None


_NP_DTYPE = re.compile(r"[<>|=]?[biufc][0-9]{1,2}")


def safe_np_dtype(name: object) -> np.dtype[Any]:
    """Only the short dtype strings numpy writes for numbers (``<f8``, ``|b1``): no
    structured, sub-array, object or string dtypes, whatever ``np.dtype`` would accept."""
    import numpy as np  # only manifests with numpy arrays or scalars need it

    if not isinstance(name, str) or not _NP_DTYPE.fullmatch(name):
        raise UnsafeCheckpointError(
            f"unknown array dtype {short(name)} in manifest: not a number type (<f8, |b1); refused"
        )
    try:
        dt = np.dtype(name)
    except (TypeError, ValueError):
        raise UnsafeCheckpointError(f"unknown array dtype {name!r} in manifest") from None
    if dt.kind not in NUMPY_KINDS:
        raise UnsafeCheckpointError(f"array dtype {name!r} is not a number type; refused")
    return dt


@dataclass(frozen=True)
class Leaves:
    """What the tags that stand for library values decode to. ``CHECK`` only checks them
    (names stay names): a manifest is checked whole without torch; loading decodes them
    into torch dtypes and devices and numpy scalars (engine/codec.TORCH_LEAVES)."""

    dtype: Callable[[object], object]
    device: Callable[[object], object]
    npscalar: Callable[[object, object], object]


def _check_dtype(name: object) -> object:
    torch_itemsize(name)
    return name


_DEVICE = re.compile(r"[a-z][a-z0-9_]{0,31}(:[0-9]{1,6})?")


def device_ok(name: object) -> TypeGuard[str]:
    """Whether ``name`` has the form of a device string (``cpu``, ``cuda:1``)."""
    return isinstance(name, str) and _DEVICE.fullmatch(name) is not None


def check_device(name: object) -> str:
    """A device string of the manifest (``cpu``, ``cuda:1``), checked for its form."""
    if not device_ok(name):
        raise UnsafeCheckpointError(f"bad device {short(name)} in manifest")
    return name


def check_np_scalar(name: object, value: object) -> np.dtype[Any]:
    """The dtype of a numpy scalar of the manifest, once ``value`` is checked to be a value of
    it (a bool for bool, an integer in range for an integer type, a number for a float):
    nothing is converted, wrapped around or rounded to infinity when it is made."""
    import numpy as np

    dt = safe_np_dtype(name)
    if dt.kind == "b":
        ok = isinstance(value, bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        ok = type(value) is int and int(info.min) <= value <= int(info.max)
    elif dt.kind == "f":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and math.isfinite(float(value)):  # type: ignore[arg-type]
            ok = abs(float(value)) <= float(np.finfo(dt).max)  # type: ignore[arg-type]
    else:  # complex scalars are not written (their item() is a Python complex)
        ok = False
    if not ok:
        raise UnsafeCheckpointError(f"numpy scalar {short(value)} does not fit dtype {dt.str}")
    return dt


def _check_npscalar(name: object, value: object) -> object:
    check_np_scalar(name, value)
    return value


CHECK = Leaves(dtype=_check_dtype, device=check_device, npscalar=_check_npscalar)

_TAGS = {"__float__", "__tensor__", "__ndarray__", "__npscalar__", "__bytes__", "__dict__",
         "__tuple__", "__dtype__", "__device__", "__stateful__"}  # fmt: skip
_TAG_EXTRA = {"__npscalar__": ("value",), "__stateful__": ("state",)}
"""The keys a tagged object has besides its tag; it has no others."""


def unflatten(tree: object, arrays: Sequence[object], leaves: Leaves = CHECK) -> Any:
    """Decode a skeleton; ``arrays[i]`` replaces tensor index ``i``."""
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return tree
    if isinstance(tree, list):
        return [
            arrays[i] if (i := _tensor_tag(x, len(arrays))) >= 0 else unflatten(x, arrays, leaves)
            for x in tree
        ]
    if not isinstance(tree, dict):
        raise UnsafeCheckpointError(f"unexpected JSON value {type(tree).__name__} in manifest")
    # Whether a key is a tag, asked of all keys at once in C: one ``startswith`` per key of
    # a dict of 20,000 tensors cost a tenth of a load (JSON keys are strings; one holding
    # "\0__" inside is looked at again, key by key).
    tag = None
    if "\0__" in "\0" + "\0".join(tree):
        tag = next((k for k in tree if k.startswith("__")), None)
    if tag is None:
        return _plain_dict(tree, arrays, leaves)
    return _tagged(tag, tree, arrays, leaves)


def _plain_dict(tree: dict[str, Any], arrays: Sequence[object], leaves: Leaves) -> dict[str, Any]:
    """A skeleton object with no tag: a dict of its keys' decoded values."""
    out = {}
    count, get = len(arrays), arrays.__getitem__
    for k, x in tree.items():
        # A tensor's tag, the commonest node of a big state by far, without another call.
        if type(x) is dict and len(x) == 1 and type(at := x.get("__tensor__")) is int and 0 <= at < count:
            out[k] = get(at)
        else:
            out[k] = unflatten(x, arrays, leaves)
    return out


def _tagged(tag: str, tree: dict[str, Any], arrays: Sequence[object], leaves: Leaves) -> Any:
    """The value a tagged object (``{"__tuple__": [...]}``) stands for, its keys checked."""
    if tag not in _TAGS:
        raise UnsafeCheckpointError(
            f"checkpoint manifest uses unknown tag {tag!r}; ferry loads only plain values and "
            "tensors and never runs code from a checkpoint: this file was not written by ferry"
        )
    if not set(tree) <= {tag, *_TAG_EXTRA.get(tag, ())}:  # what else reads the tree sees the same
        raise UnsafeCheckpointError(f"a {tag} object in the manifest has other keys: {short(sorted(tree))}")
    val = tree[tag]
    if tag == "__float__":
        if val not in ("nan", "inf", "-inf"):
            raise UnsafeCheckpointError(f"bad float literal {val!r} in manifest")
        return float(val)
    if tag in ("__tensor__", "__ndarray__"):
        if type(val) is not int or not 0 <= val < len(arrays):
            raise UnsafeCheckpointError(f"manifest refers to missing tensor {short(val)}")
        return arrays[val]
    if tag == "__npscalar__":
        return leaves.npscalar(val, unflatten(tree["value"], arrays, leaves))
    if tag == "__bytes__":
        return _bytes(val)
    if tag == "__dict__":
        if not isinstance(val, list) or not all(isinstance(p, list) and len(p) == 2 for p in val):
            raise UnsafeCheckpointError("a __dict__ in the manifest is not a list of [key, value] pairs")
        return {_hashable(unflatten(k, arrays, leaves)): unflatten(x, arrays, leaves) for k, x in val}
    if tag == "__tuple__":
        if not isinstance(val, list):
            raise UnsafeCheckpointError(f"a __tuple__ in the manifest is not a list: {short(val)}")
        return tuple(unflatten(x, arrays, leaves) for x in val)
    if tag == "__dtype__":
        return leaves.dtype(val)
    if tag == "__device__":
        return leaves.device(val)
    if not isinstance(val, str):  # __stateful__: a type name, a label only
        raise UnsafeCheckpointError(f"a __stateful__ type name in the manifest is not a string: {short(val)}")
    return unflatten(tree["state"], arrays, leaves)  # its state dict


def _bytes(val: object) -> bytes:
    """The bytes a ``__bytes__`` tag holds as base64 text."""
    if not isinstance(val, str):
        raise UnsafeCheckpointError(f"bytes in manifest are not base64 text: {short(val)}")
    try:
        return base64.b64decode(val, validate=True)
    except ValueError:
        raise UnsafeCheckpointError(f"bytes in manifest are not base64 text: {short(val)}") from None


def _tensor_tag(node: object, count: int) -> int:
    """The index of a valid tensor tag (``{"__tensor__": i}``), or -1."""
    if type(node) is dict and len(node) == 1:
        index = node.get("__tensor__")
        if type(index) is int and 0 <= index < count:
            return index
    return -1


def _hashable(k: object) -> object:
    if isinstance(k, list):
        raise UnsafeCheckpointError("manifest uses a list as a dict key")
    return k


def manifest_checksum(body: Mapping[str, object]) -> str:
    """xxh3-64 of the manifest without its checksum, serialized compactly, keys in order."""
    canon = json.dumps(body, separators=(",", ":"))  # key order kept: state dicts are ordered
    return str(xxhash.xxh3_64_hexdigest(canon.encode()))


class RawJSON(str):
    """JSON text that ``manifest_bytes`` writes as it is: a field its writer encoded itself,
    exactly as ``json.dumps(value, separators=(",", ":"))`` would (engine/codec.entries_json).
    Only for writing: a manifest read back holds the decoded values."""


_OWN = ("tensors", "tree")
_ENTRY_BREAK = b'},{"dtype":'
_SHOWN_BREAK = b'},\n{"dtype":'
"""Where one tensor entry ends and the next begins in compact JSON: nowhere else, since a
quote inside a string is escaped (``\\"``), and a string's closing quote is followed by
``,``, ``:``, ``}`` or ``]``, never by ``dtype``."""


def manifest_bytes(body: Mapping[str, object]) -> bytes:
    """Serialize with a checksum over the canonical body, so a damaged manifest is caught.

    The bytes are the canonical (compact) form itself with the checksum as the last field,
    and line breaks between the top-level fields and between tensor entries, for people
    reading it: JSON strings hold no raw line breaks, so the canonical form is the file
    without its line breaks (``written_checksum``), and reading it needs no second
    serialization. Encoding runs in json's C encoder (``indent`` would take its Python one:
    a manifest of 20,000 tensors took half a second). A ``RawJSON`` value is written as it
    is (the tensor table, which engine/codec.entries_json formats in a third of json's time)."""
    compact = (",", ":")
    hasher = xxhash.xxh3_64()
    shown: list[bytes] = []
    for key, value in body.items():
        # The tensor table and the tree are ferry's own fresh containers, never cyclic: no
        # cycle check (a fifth of the time); ``meta`` is the caller's and keeps it.
        own = key in _OWN
        text = (
            value
            if isinstance(value, RawJSON)
            else json.dumps(value, separators=compact, check_circular=not own)
        )
        # Each field is encoded once and hashed piece by piece, never joined first: every
        # copy of a 3 MB table left out also saves its fresh memory, which costs as much.
        head, data = f"{'{' if not shown else ','}{json.dumps(key)}:".encode(), text.encode()
        hasher.update(head)
        hasher.update(data)
        shown.append(head)
        shown.append(data.replace(_ENTRY_BREAK, _SHOWN_BREAK) if key == "tensors" else data)
    hasher.update(b"}")
    shown[2::2] = [b",\n" + head[1:] for head in shown[2::2]]
    return b"".join([*shown, f',\n"checksum":"{hasher.hexdigest()}"}}\n'.encode()])


_WRITTEN = re.compile(rb',"checksum":"([0-9a-f]{16})"\}')


def written_checksum(data: bytes) -> str | None:
    """The checksum of a manifest file as ``manifest_bytes`` writes it, if its bytes verify
    against it without a second serialization: the file without line breaks, less its last
    field ``"checksum"``, hashes to that field's value. None otherwise (a manifest written
    with other spacing, or damaged): ``manifest_checksum`` over the decoded body decides."""
    flat = data.replace(b"\n", b"")
    m = _WRITTEN.fullmatch(flat, max(len(flat) - 31, 0))
    if m is None or xxhash.xxh3_64_hexdigest(flat[: m.start()] + b"}") != m[1].decode():
        return None
    return m[1].decode()
