"""The manifest of a checkpoint (docs/format.md), declared once and checked where it is read.

``Manifest``, ``FileEntry`` and ``TensorRecord`` are the document as JSON has it; the
writer (persist.py) builds one, and ``parse_manifest`` turns whatever a file holds into
one, or raises: ``CorruptCheckpointError`` for a damaged or malformed manifest (the
message names the field), ``UnsafeCheckpointError`` for one that asks for something
ferry never does (a pickle, an unknown dtype or tag). Nothing is read from the data files
before the whole manifest, its state tree included, passed.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypedDict

from ferry.errors import CorruptCheckpointError, UnsafeCheckpointError
from ferry.format.wire import (
    CHECK,
    FORMAT_NAME,
    FORMAT_VERSION,
    TORCH_ITEMSIZES,
    Leaves,
    check_device,
    device_ok,
    manifest_checksum,
    safe_np_dtype,
    torch_itemsize,
    unflatten,
    written_checksum,
)
from ferry.typedjson import INT_MAX, INT_MIN, SchemaError, parse


class FileEntry(TypedDict):
    """One file of the checkpoint, the manifest aside."""

    size: int
    xxh3_64: str
    """XXH3-64 of the whole file, lowercase hex."""


class TensorRecord(TypedDict):
    """Where tensor ``i`` of the tree lies, and what it is."""

    dtype: str
    """A name from engine/codec.TORCH_DTYPES (torch), or numpy's dtype string (numpy)."""
    shape: list[int]
    nbytes: int
    kind: Literal["torch", "numpy"]
    device: str
    """Where it was saved from; informational."""
    file: str
    offset: int


class Manifest(TypedDict):
    format: str
    version: int
    step: int
    created: float
    created_iso: str
    ferry_version: str
    torch_version: str
    python_version: str
    host: str
    pid: int
    world_size: int
    files: dict[str, FileEntry]
    tensors: list[TensorRecord]
    tree: object
    """The state, JSON with the tags of wire.py; checked by decoding it."""
    meta: dict[str, object]


class Part(TypedDict):
    """A rank's own part of a multi-rank checkpoint (``rank-R.json``, engine/ranks.py)."""

    tree: object
    tensors: list[TensorRecord]


MAX_DEPTH = 200
"""How deep JSON may nest in a manifest: a state tree nested this deep is not a training
state, and walking a deeper one could exhaust Python's stack anywhere it is used."""
MAX_DIMS = 32
"""The most dimensions a tensor may have (numpy's limit before 2.0)."""


def check_depth(doc: object, where: str) -> None:
    """Refuse JSON nested deeper than MAX_DEPTH (a value at a depth above it), without
    recursion. Only containers go on the stack: a scalar's depth is its holder's plus one.
    A tensor's tag (``{"__tensor__": i}``, the commonest node of a big state by far) holds
    a scalar only: it is too deep only at MAX_DEPTH itself, and goes on the stack only there."""
    todo: list[tuple[dict[str, object] | list[object], int]] = []
    if type(doc) is dict or type(doc) is list:
        todo.append((doc, 0))
    while todo:
        node, depth = todo.pop()
        values = node.values() if type(node) is dict else node
        if depth >= MAX_DEPTH and values:
            raise _malformed(where, f"nests deeper than {MAX_DEPTH} levels")
        below = depth + 1
        tags_fit = below < MAX_DEPTH
        for v in values:
            kind = type(v)
            if kind is dict:
                if tags_fit and len(v) == 1 and type(v.get("__tensor__")) is int:  # type: ignore[arg-type,attr-defined]
                    continue
                todo.append((v, below))  # type: ignore[arg-type]
            elif kind is list:
                todo.append((v, below))  # type: ignore[arg-type]


def _malformed(where: str, why: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{where}: malformed manifest: {why}")


def decode_manifest(data: bytes, where: str) -> Manifest:
    """The manifest in the bytes of ``manifest.json``, checked (``parse_manifest``)."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        if data[:2] == b"PK" or data[:1] == b"\x80":
            raise UnsafeCheckpointError(
                f"{where} is a pickle/zip file, not a ferry manifest; ferry never unpickles"
            ) from exc
        raise CorruptCheckpointError(f"{where}: manifest is not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise CorruptCheckpointError(f"{where}: manifest nests too deep to be ferry's") from exc
    return parse_manifest(doc, where, written_checksum(data))


def parse_manifest(raw: object, where: str, verified: str | None = None) -> Manifest:
    """``raw`` (decoded JSON) as a Manifest: what it is, its version, its checksum, every
    field's type, the file names, each tensor's place in its file, and the state tree.

    ``verified``: the checksum that the file's own bytes were found to carry
    (``wire.written_checksum``); the body is then not serialized again to check it."""
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        raise UnsafeCheckpointError(f"{where} is not a ferry checkpoint manifest")
    fast = verified is not None and raw.get("checksum") == verified
    # Records that pass _plain_records are a fixed three levels deep: their walk is left
    # out when nothing serializes the body again (the checksum was verified from the bytes).
    check_depth({k: v for k, v in raw.items() if k != "tensors"} if fast else raw, where)
    version = raw.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _malformed(where, f"version: expected an integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise CorruptCheckpointError(
            f"{where}: format version {version} is newer than this ferry "
            f"understands ({FORMAT_VERSION}); upgrade ferry"
        )
    body = {k: v for k, v in raw.items() if k != "checksum"}
    if not fast and raw.get("checksum") != manifest_checksum(body):
        raise CorruptCheckpointError(f"{where}: manifest checksum mismatch (damaged file)")
    records = _fitting_records(body.get("tensors"), body.get("files"))
    checked = records is not None  # check_tensors' checks passed already
    if records is None:
        records = _plain_records(body.get("tensors"))
    if records is None and fast:  # the schema's messages print values: not nested deep
        check_depth({"tensors": body.get("tensors")}, where)
    try:
        if records is None:  # the schema says what is wrong, and where
            manifest = parse(body, Manifest)
        else:
            manifest = parse({**body, "tensors": []}, Manifest)
            manifest["tensors"] = records
    except SchemaError as exc:
        raise _malformed(where, str(exc)) from None
    if manifest["step"] < 0 or manifest["world_size"] < 1:
        raise _malformed(where, f"step {manifest['step']}, world_size {manifest['world_size']}")
    try:
        time.strptime(manifest["created_iso"], "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        raise _malformed(where, f"created_iso {manifest['created_iso'][:40]!r} is not a UTC time") from None
    _check_body(manifest, manifest["files"], where, tensors_checked=checked)
    return manifest


_RECORD_KEYS = len(TensorRecord.__annotations__)


def _plain_records(value: object) -> list[TensorRecord] | None:
    """``value`` itself when it is a list of tensor records exactly as the schema declares
    them (its keys, no others; each value of its type, integers in range): what every
    manifest ferry writes holds, checked at a fraction of the schema's cost per record
    (a checkpoint may hold tens of thousands). None when any record is not: the schema
    then checks the list, and its message names the field."""
    if type(value) is not list:
        return None
    for e in value:
        if type(e) is not dict or len(e) != _RECORD_KEYS:
            return None
        shape, nbytes, offset = e.get("shape"), e.get("nbytes"), e.get("offset")
        if not (
            type(e.get("dtype")) is str
            and type(e.get("device")) is str
            and type(e.get("file")) is str
            and e.get("kind") in ("torch", "numpy")
            and type(nbytes) is int
            and type(offset) is int
            and INT_MIN <= nbytes <= INT_MAX
            and INT_MIN <= offset <= INT_MAX
            and type(shape) is list
        ):
            return None
        for dim in shape:
            if type(dim) is not int or not INT_MIN <= dim <= INT_MAX:
                return None
    return value  # type: ignore[return-value]


def _file_sizes(files: object) -> dict[object, int] | None:
    """Each file's size, when ``files`` is a plain dict of plain sizes; None otherwise."""
    if type(files) is not dict:
        return None
    sizes: dict[object, int] = {}
    for name, meta in files.items():
        size = meta.get("size") if type(meta) is dict else None
        if type(size) is not int or not 0 <= size <= INT_MAX:
            return None
        sizes[name] = size
    return sizes


def _fitting_records(value: object, files: object) -> list[TensorRecord] | None:
    """``value`` itself when every record is plain (``_plain_records``) and passes
    ``check_tensors`` against ``files`` (the manifest's, not yet parsed): both checks in
    one pass, a field read once, for the tens of thousands of records of a big state. None
    when any record does not (or ``files`` is not plain): the two checks then run as
    always, in their order, and their messages say what is wrong."""
    sizes = _file_sizes(files)
    if type(value) is not list or sizes is None:
        return None
    # A state has few kinds of records: (kind, dtype, device, file) is checked once. Only a
    # str equals a str in JSON, so a key equal to one found good is made of strs too.
    seen: dict[tuple[object, ...], tuple[int, int]] = {}
    for e in value:
        if type(e) is not dict or len(e) != _RECORD_KEYS:
            return None
        try:
            key = (e["kind"], e["dtype"], e["device"], e["file"])
            shape, nbytes, offset = e["shape"], e["nbytes"], e["offset"]
            known = seen.get(key)  # (a list or dict in it is unhashable: TypeError)
        except (KeyError, TypeError):
            return None
        if known is None:
            if (known := _record_kind(key, sizes)) is None:
                return None
            seen[key] = known
        if type(nbytes) is not int or type(offset) is not int or type(shape) is not list:
            return None
        if len(shape) > MAX_DIMS:
            return None
        count, empty = 1, False
        for dim in shape:
            if type(dim) is not int or dim < 0:
                return None
            if dim:
                count *= dim
            else:
                empty = True
        itemsize, size = known
        if (
            count >= 2**62
            or nbytes != (0 if empty else count * itemsize)
            or nbytes > INT_MAX
            or offset < 0
            or offset % itemsize
            or offset + nbytes > size
        ):
            return None
    return value  # type: ignore[return-value]


def _record_kind(key: tuple[object, ...], sizes: dict[object, int]) -> tuple[int, int] | None:
    """(item size, file size) for a record's (kind, dtype, device, file) when all four are
    good: a known dtype of its kind, a device ferry can name, a file of the manifest."""
    kind, dtype, device, file = key
    if type(kind) is not str or type(dtype) is not str or type(file) is not str:
        return None
    itemsize: int | None = None
    if kind == "torch":
        itemsize = TORCH_ITEMSIZES.get(dtype)
    elif kind == "numpy":
        try:
            itemsize = safe_np_dtype(dtype).itemsize
        except UnsafeCheckpointError:
            return None
    size = sizes.get(file)
    if itemsize is None or size is None or not device_ok(device):
        return None
    return itemsize, size


def parse_part(raw: object, files: Mapping[str, FileEntry], where: str) -> Part:
    """A rank's part, checked as a manifest's tree and tensors are, against ``files``."""
    check_depth(raw, where)
    try:
        part = parse(raw, Part)
    except SchemaError as exc:
        raise _malformed(where, str(exc)) from None
    _check_body(part, files, where)
    return part


def _check_body(
    doc: Manifest | Part, files: Mapping[str, FileEntry], where: str, tensors_checked: bool = False
) -> None:
    try:
        check_files(files, where)
        if not tensors_checked:
            check_tensors(doc["tensors"], files, where)
        decode_tree(doc, [None] * len(doc["tensors"]), where)  # refuse before any data
    except CorruptCheckpointError as exc:
        if where in str(exc):
            raise
        raise type(exc)(f"{where}: {exc}") from exc  # say which checkpoint, not only why


def check_files(files: Mapping[str, FileEntry], where: str) -> None:
    """Every name stays inside the checkpoint folder; every size is a size."""
    for file, meta in files.items():
        parts = file.split("/")
        bad = any(p in ("", ".", "..") or not p.isprintable() for p in parts)
        if file.startswith("/") or "\\" in file or bad or len(file) > 4096:
            raise _malformed(where, f"file name {file!r} points outside the checkpoint folder")
        if meta["size"] < 0:
            raise _malformed(where, f"files.{file}.size: {meta['size']} is negative")


def check_tensors(tensors: list[TensorRecord], files: Mapping[str, FileEntry], where: str) -> None:
    """Each tensor's bytes fit its dtype and shape and lie inside a file of the checkpoint."""
    devices: set[str] = set()  # checked already: a checkpoint names a few, many times
    itemsizes: dict[tuple[str, str], int] = {}
    for i, e in enumerate(tensors):
        meta = files.get(e["file"])
        if meta is None:
            raise _malformed(where, f"tensor {i} names no file of the checkpoint")
        shape, offset, nbytes = e["shape"], e["offset"], e["nbytes"]
        # Every dimension counted as at least 1: an empty tensor of shape (2**40, 2**40, 0)
        # is as impossible to make as a full one.
        low = min(shape, default=1) if len(shape) <= MAX_DIMS else -1  # a product of few factors
        count = math.prod(shape) if low > 0 else math.prod(max(s, 1) for s in shape) if low == 0 else 0
        if low < 0 or count >= 2**62:
            raise _malformed(where, f"tensor {i} has shape {shape!r}"[:200])
        if e["device"] not in devices:
            devices.add(check_device(e["device"]))  # informational, but printed and compared
        if offset < 0 or nbytes < 0:
            raise _malformed(where, f"tensor {i} has offset {offset!r}, nbytes {nbytes!r}")
        key = (e["kind"], e["dtype"])
        itemsize = itemsizes.get(key)
        if itemsize is None:
            numpy = e["kind"] == "numpy"
            itemsize = safe_np_dtype(e["dtype"]).itemsize if numpy else torch_itemsize(e["dtype"])
            itemsizes[key] = itemsize
        if nbytes != (count if low > 0 else 0) * itemsize or offset % itemsize:
            raise _malformed(
                where, f"tensor {i}: {nbytes} bytes at offset {offset} do not fit {e['dtype']} {shape}"
            )
        if offset + nbytes > meta["size"]:
            raise _malformed(where, f"tensor {i} lies outside its file")


def decode_tree(doc: Manifest | Part, arrays: Sequence[object], where: str, leaves: Leaves = CHECK) -> Any:
    """The state tree of ``doc`` with tensor ``i`` replaced by ``arrays[i]``; a malformed
    tree is a CorruptCheckpointError, an unsafe one an UnsafeCheckpointError. ``leaves``:
    CHECK only checks dtypes and devices (no torch); a load gives engine/codec.TORCH_LEAVES."""
    try:
        return unflatten(doc["tree"], arrays, leaves)
    except CorruptCheckpointError:
        raise
    except (
        KeyError,
        TypeError,
        ValueError,
        IndexError,
        AttributeError,
        RecursionError,
        OverflowError,
    ) as exc:
        first = (str(exc).splitlines() or [""])[0][:200]
        raise CorruptCheckpointError(
            f"{where}: malformed manifest tree ({type(exc).__name__}: {first})"
        ) from exc


__all__ = [
    "FileEntry",
    "Manifest",
    "Part",
    "TensorRecord",
    "check_files",
    "check_tensors",
    "decode_manifest",
    "decode_tree",
    "parse_manifest",
    "parse_part",
]
