"""The description of sharded state (DCP's ``Metadata``) as JSON, and back, checked whole.

torch.distributed.checkpoint keeps the description of a checkpoint (every entry of the
flattened state dict: a tensor's dtype, global size and chunks, or a plain value; and
where each chunk or value lies in the files) as a ``Metadata`` object, which its own
writer pickles into ``.metadata``. Ferry writes it as ``dcp/metadata.json`` instead::

    {"format": "ferry-dcp", "version": 1,
     "entries": {"m.model.0.weight": {"kind": "tensor", "dtype": "float32", "size": [32, 12],
                                      "chunks": [{"offsets": [0, 0], "sizes": [16, 12],
                                                  "file": "shards-0.bin", "offset": 0,
                                                  "length": 768}, ...]},
                 "m.optim.param_groups.0.lr": {"kind": "value", "chunks": [{"offsets": [],
                                                "sizes": [], "file": "shards-0.bin",
                                                "offset": 1536, "length": 5}]}},
     "paths": {"m.model.0.weight": ["m", "model", "0.weight"], ...},
     "checksum": "<xxh3-64 of the rest>"}

``parse`` refuses anything but that shape before DCP sees any of it: names of files ferry
writes, chunks inside their tensor, byte counts that are the chunk's, at most MAX_DIMS
dimensions. Where a chunk lies in its file is checked against the file's size when it is
read (dcpio.py).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from ferry.engine.format import DTYPE_NAMES, torch_dtype
from ferry.engine.manifest import MAX_DIMS, check_depth
from ferry.engine.wire import manifest_bytes, manifest_checksum, torch_itemsize
from ferry.errors import CorruptCheckpointError, FerryError, UnsafeCheckpointError
from ferry.typedjson import SchemaError, parse

FORMAT = "ferry-dcp"
VERSION = 1
METADATA = "metadata.json"
SHARDS = re.compile(r"shards-(0|[1-9][0-9]{0,5})\.bin")
"""The data files: ``shards-R.bin``, written by rank R."""


def shards_file(rank: int) -> str:
    return f"shards-{rank}.bin"


@dataclass(frozen=True)
class Stored:
    """Where one chunk (or one value) lies: DCP's ``storage_data`` for an item. ``dtype``
    and ``sizes`` are the chunk's; None for a value."""

    file: str
    offset: int
    length: int
    dtype: torch.dtype | None = None
    sizes: tuple[int, ...] | None = None


class ChunkDoc(TypedDict):
    offsets: list[int]
    sizes: list[int]
    file: str
    offset: int
    length: int


class EntryDoc(TypedDict, total=False):
    kind: Literal["tensor", "value"]
    dtype: str
    size: list[int]
    chunks: list[ChunkDoc]


class Description(TypedDict):
    format: str
    version: int
    entries: dict[str, EntryDoc]
    paths: dict[str, list[str | int]]


# ------------------------------------------------------------------------------ writing


def encode(metadata: Metadata, stored: dict[MetadataIndex, Stored]) -> bytes:
    """``metadata`` (DCP's, after a save) with where each of its items was written."""
    entries: dict[str, dict[str, Any]] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            if md.properties.dtype not in DTYPE_NAMES:
                raise FerryError(f"sharded entry {fqn} is {md.properties.dtype}, a dtype ferry does not save")
            chunks = [_chunk(stored, fqn, list(c.offsets), list(c.sizes)) for c in md.chunks]
            entries[fqn] = {"kind": "tensor", "dtype": DTYPE_NAMES[md.properties.dtype],
                            "size": list(md.size), "chunks": chunks}  # fmt: skip
        else:
            entries[fqn] = {"kind": "value", "chunks": [_chunk(stored, fqn, None, [])]}
    paths = metadata.planner_data if isinstance(metadata.planner_data, dict) else {}
    body = {"format": FORMAT, "version": VERSION, "entries": entries,
            "paths": {k: list(v) for k, v in paths.items()}}  # fmt: skip
    return manifest_bytes(body)


def _chunk(
    stored: dict[MetadataIndex, Stored], fqn: str, offsets: list[int] | None, sizes: list[int]
) -> dict[str, Any]:
    where = stored.get(MetadataIndex(fqn, offsets))
    if where is None:  # DCP planned an item that no rank reported writing
        raise FerryError(f"no rank wrote the sharded entry {fqn} at {offsets}: a bug in ferry's DCP writer")
    return {"offsets": offsets or [], "sizes": sizes, "file": where.file, "offset": where.offset,
            "length": where.length}  # fmt: skip


# ------------------------------------------------------------------------------ reading


def decode(data: bytes, where: str) -> tuple[Metadata, dict[MetadataIndex, Stored]]:
    """The bytes of ``metadata.json`` as DCP's Metadata (its ``storage_data`` the dict
    returned beside it), checked whole; CorruptCheckpointError or UnsafeCheckpointError."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        if data[:1] == b"\x80" or data[:2] == b"PK":
            raise UnsafeCheckpointError(f"{where} is a pickle, not JSON; ferry never unpickles") from exc
        raise CorruptCheckpointError(f"{where} is not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise CorruptCheckpointError(f"{where} nests too deep to be ferry's") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise UnsafeCheckpointError(f"{where} is not the description of ferry's sharded state; refused")
    check_depth(raw, where)
    body = {k: v for k, v in raw.items() if k != "checksum"}
    if raw.get("checksum") != manifest_checksum(body):
        raise CorruptCheckpointError(f"{where}: checksum mismatch (damaged file)")
    try:
        doc = parse(body, Description)
    except SchemaError as exc:
        raise CorruptCheckpointError(f"{where}: malformed: {exc}") from None
    if doc["version"] != VERSION:
        raise CorruptCheckpointError(f"{where}: version {doc['version']} is not {VERSION}: not this ferry's")
    entries: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
    stored: dict[MetadataIndex, Stored] = {}
    for fqn, entry in doc["entries"].items():
        try:
            entries[fqn] = _entry(fqn, entry, stored)
        except (CorruptCheckpointError, SchemaError) as exc:  # Unsafe stays Unsafe
            kind = type(exc) if isinstance(exc, CorruptCheckpointError) else CorruptCheckpointError
            raise kind(f"{where}: entry {fqn[:80]!r}: {exc}") from None
    paths = {k: tuple(v) for k, v in doc["paths"].items()}
    return Metadata(state_dict_metadata=entries, planner_data=paths, storage_data=stored), stored


def _entry(
    fqn: str, entry: EntryDoc, stored: dict[MetadataIndex, Stored]
) -> TensorStorageMetadata | BytesStorageMetadata:
    kind, chunks = entry.get("kind"), entry.get("chunks")
    if kind is None or chunks is None:
        raise SchemaError("kind" if kind is None else "chunks", "missing")
    if kind == "value":
        if len(chunks) != 1 or chunks[0]["offsets"] or chunks[0]["sizes"]:
            raise CorruptCheckpointError("a value is one chunk with no offsets or sizes")
        c = chunks[0]
        stored[MetadataIndex(fqn)] = Stored(_file(c["file"]), *_span(c))
        return BytesStorageMetadata()
    dtype, size = torch_dtype(entry.get("dtype")), entry.get("size")
    # every dimension counted as at least 1, as manifest.check_tensors does
    if (
        size is None
        or len(size) > MAX_DIMS
        or any(s < 0 for s in size)
        or math.prod(max(s, 1) for s in size) >= 1 << 62
    ):
        raise CorruptCheckpointError(f"size {size!r} is not a tensor's"[:200])
    itemsize = torch_itemsize(entry.get("dtype"))
    out = []
    for c in chunks:
        offsets, sizes = c["offsets"], c["sizes"]
        if len(offsets) != len(size) or len(sizes) != len(size):
            raise CorruptCheckpointError(
                f"a chunk has {len(offsets)} offsets, {len(sizes)} sizes, {len(size)} dims"
            )
        if any(o < 0 or s < 0 or o + s > d for o, s, d in zip(offsets, sizes, size, strict=True)):
            raise CorruptCheckpointError(f"chunk {offsets} + {sizes} lies outside size {size}"[:200])
        offset, length = _span(c)
        if length != math.prod(sizes) * itemsize:
            raise CorruptCheckpointError(
                f"a chunk of {sizes} {entry.get('dtype')} is not {length} bytes"[:200]
            )
        index = MetadataIndex(fqn, offsets)
        if index in stored:
            raise CorruptCheckpointError(f"two chunks at {offsets}")
        stored[index] = Stored(_file(c["file"]), offset, length, dtype, tuple(sizes))
        out.append(ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes)))
    return TensorStorageMetadata(properties=TensorProperties(dtype=dtype), size=torch.Size(size), chunks=out)


def _span_of(size: list[int]) -> int:
    return math.prod(max(s, 1) for s in size)


def _file(name: str) -> str:
    if not SHARDS.fullmatch(name):
        raise UnsafeCheckpointError(f"file {name[:80]!r} is not one ferry writes (shards-R.bin); refused")
    return name


def _span(c: ChunkDoc) -> tuple[int, int]:
    if c["offset"] < 0 or c["length"] < 0:
        raise CorruptCheckpointError(f"offset {c['offset']}, length {c['length']}")
    return c["offset"], c["length"]
