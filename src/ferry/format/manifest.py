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
from typing import Any, TypedDict

from ferry.errors import CorruptCheckpointError, UnsafeCheckpointError
from ferry.format.records import MAX_DIMS as MAX_DIMS
from ferry.format.records import TensorRecord as TensorRecord
from ferry.format.records import fitting_records, plain_records
from ferry.format.wire import (
    CHECK,
    FORMAT_NAME,
    FORMAT_VERSION,
    Leaves,
    check_device,
    manifest_checksum,
    safe_np_dtype,
    torch_itemsize,
    unflatten,
    written_checksum,
)
from ferry.typedjson import SchemaError, parse


class FileEntry(TypedDict):
    """One file of the checkpoint, the manifest aside."""

    size: int
    xxh3_64: str
    """XXH3-64 of the whole file, lowercase hex."""


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
    records = fitting_records(body.get("tensors"), body.get("files"))
    checked = records is not None  # check_tensors' checks passed already
    if records is None:
        records = plain_records(body.get("tensors"))
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
