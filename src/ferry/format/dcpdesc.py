"""The description of sharded state (DCP's ``Metadata``) as JSON, checked whole.

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

``decode`` refuses anything but that shape before DCP sees any of it: names of files ferry
writes, chunks inside their tensor, byte counts that are the chunk's, at most MAX_DIMS
dimensions. Where a chunk lies in its file is checked against the file's size when it is
read (engine/dcpio.py). This module is torch-free; engine/dcpmeta.py turns a description
into DCP's ``Metadata`` and back.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Literal, TypedDict

from ferry.errors import CorruptCheckpointError, UnsafeCheckpointError
from ferry.format.manifest import MAX_DIMS, check_depth
from ferry.format.wire import manifest_bytes, manifest_checksum, torch_itemsize
from ferry.typedjson import SchemaError, parse

FORMAT = "ferry-dcp"
VERSION = 1
METADATA = "metadata.json"
SHARDS = re.compile(r"shards-(0|[1-9][0-9]{0,5})\.bin")
"""The data files: ``shards-R.bin``, written by rank R."""


def shards_file(rank: int) -> str:
    return f"shards-{rank}.bin"


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


@dataclass(frozen=True)
class Chunk:
    """Where one checked chunk of a tensor lies (a value's bytes: no offsets, no sizes)."""

    offsets: list[int]
    sizes: list[int]
    file: str
    offset: int
    length: int


@dataclass(frozen=True)
class Entry:
    """One checked entry: a tensor (``dtype`` its name, ``size`` its global size, its
    chunks inside it, none twice) or a plain value (``dtype`` None, one chunk)."""

    dtype: str | None
    size: list[int]
    chunks: list[Chunk]


@dataclass(frozen=True)
class Checked:
    """A description read back and checked whole."""

    entries: dict[str, Entry]
    paths: dict[str, tuple[str | int, ...]]


# ------------------------------------------------------------------------------ writing


def encode(entries: dict[str, EntryDoc], paths: dict[str, list[str | int]]) -> bytes:
    """The bytes of ``metadata.json`` for ``entries`` and ``paths`` (DCP's planner data)."""
    body = {"format": FORMAT, "version": VERSION, "entries": entries, "paths": paths}
    return manifest_bytes(body)


# ------------------------------------------------------------------------------ reading


def decode(data: bytes, where: str) -> Checked:
    """The bytes of ``metadata.json``, checked whole; CorruptCheckpointError or
    UnsafeCheckpointError (named after ``where``)."""
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
    entries: dict[str, Entry] = {}
    for fqn, entry in doc["entries"].items():
        try:
            entries[fqn] = _entry(entry)
        except (CorruptCheckpointError, SchemaError) as exc:  # Unsafe stays Unsafe
            raise entry_error(exc, where, fqn) from None
    return Checked(entries, {k: tuple(v) for k, v in doc["paths"].items()})


def entry_error(exc: CorruptCheckpointError | SchemaError, where: str, fqn: str) -> CorruptCheckpointError:
    """``exc``, found in entry ``fqn`` of the description at ``where``, named after both."""
    kind = type(exc) if isinstance(exc, CorruptCheckpointError) else CorruptCheckpointError
    return kind(f"{where}: entry {fqn[:80]!r}: {exc}")


def _entry(entry: EntryDoc) -> Entry:
    kind, chunks = entry.get("kind"), entry.get("chunks")
    if kind is None or chunks is None:
        raise SchemaError("kind" if kind is None else "chunks", "missing")
    if kind == "value":
        if len(chunks) != 1 or chunks[0]["offsets"] or chunks[0]["sizes"]:
            raise CorruptCheckpointError("a value is one chunk with no offsets or sizes")
        c = chunks[0]
        return Entry(None, [], [Chunk([], [], _file(c["file"]), *_span(c))])
    name, size = entry.get("dtype"), entry.get("size")
    itemsize = torch_itemsize(name)
    # every dimension counted as at least 1, as manifest.check_tensors does
    if (
        size is None
        or len(size) > MAX_DIMS
        or any(s < 0 for s in size)
        or math.prod(max(s, 1) for s in size) >= 1 << 62
    ):
        raise CorruptCheckpointError(f"size {size!r} is not a tensor's"[:200])
    seen: set[tuple[int, ...]] = set()
    out = [_tensor_chunk(c, name, size, itemsize, seen) for c in chunks]
    return Entry(str(name), size, out)  # a name torch_itemsize knows


def _tensor_chunk(
    c: ChunkDoc, dtype: object, size: list[int], itemsize: int, seen: set[tuple[int, ...]]
) -> Chunk:
    """Chunk ``c`` of a tensor of ``size``, checked to lie inside it, to be as many bytes
    as its elements, and to be the only one at its offsets (``seen`` so far)."""
    offsets, sizes = c["offsets"], c["sizes"]
    if len(offsets) != len(size) or len(sizes) != len(size):
        raise CorruptCheckpointError(
            f"a chunk has {len(offsets)} offsets, {len(sizes)} sizes, {len(size)} dims"
        )
    if any(o < 0 or s < 0 or o + s > d for o, s, d in zip(offsets, sizes, size, strict=True)):
        raise CorruptCheckpointError(f"chunk {offsets} + {sizes} lies outside size {size}"[:200])
    offset, length = _span(c)
    if length != math.prod(sizes) * itemsize:
        raise CorruptCheckpointError(f"a chunk of {sizes} {dtype} is not {length} bytes"[:200])
    if tuple(offsets) in seen:
        raise CorruptCheckpointError(f"two chunks at {offsets}")
    seen.add(tuple(offsets))
    return Chunk(offsets, sizes, _file(c["file"]), offset, length)


def _file(name: str) -> str:
    if not SHARDS.fullmatch(name):
        raise UnsafeCheckpointError(f"file {name[:80]!r} is not one ferry writes (shards-R.bin); refused")
    return name


def _span(c: ChunkDoc) -> tuple[int, int]:
    if c["offset"] < 0 or c["length"] < 0:
        raise CorruptCheckpointError(f"offset {c['offset']}, length {c['length']}")
    return c["offset"], c["length"]
