"""DCP's ``Metadata`` as ferry's description of sharded state (format/dcpdesc.py), and back.

The description is torch-free JSON, checked whole by format/dcpdesc.py; this module adds
torch's side: the dtypes, sizes and chunks DCP's planners take, and where each item lies
(``Stored``, DCP's ``storage_data``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from ferry.engine.codec import DTYPE_NAMES, torch_dtype
from ferry.errors import CorruptCheckpointError, FerryError
from ferry.format import dcpdesc
from ferry.format.dcpdesc import ChunkDoc, EntryDoc


@dataclass(frozen=True)
class Stored:
    """Where one chunk (or one value) lies: DCP's ``storage_data`` for an item. ``dtype``
    and ``sizes`` are the chunk's; None for a value."""

    file: str
    offset: int
    length: int
    dtype: torch.dtype | None = None
    sizes: tuple[int, ...] | None = None


def encode(metadata: Metadata, stored: dict[MetadataIndex, Stored]) -> bytes:
    """``metadata`` (DCP's, after a save) with where each of its items was written."""
    entries: dict[str, EntryDoc] = {}
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
    return dcpdesc.encode(entries, {k: list(v) for k, v in paths.items()})


def _chunk(
    stored: dict[MetadataIndex, Stored], fqn: str, offsets: list[int] | None, sizes: list[int]
) -> ChunkDoc:
    where = stored.get(MetadataIndex(fqn, offsets))
    if where is None:  # DCP planned an item that no rank reported writing
        raise FerryError(f"no rank wrote the sharded entry {fqn} at {offsets}: a bug in ferry's DCP writer")
    return {"offsets": offsets or [], "sizes": sizes, "file": where.file, "offset": where.offset,
            "length": where.length}  # fmt: skip


def decode(data: bytes, where: str) -> tuple[Metadata, dict[MetadataIndex, Stored]]:
    """The bytes of ``metadata.json`` as DCP's Metadata (its ``storage_data`` the dict
    returned beside it), checked whole; CorruptCheckpointError or UnsafeCheckpointError."""
    checked = dcpdesc.decode(data, where)
    entries: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
    stored: dict[MetadataIndex, Stored] = {}
    for fqn, entry in checked.entries.items():
        try:
            entries[fqn] = _entry(fqn, entry, stored)
        except CorruptCheckpointError as exc:  # a dtype name this torch lacks
            raise dcpdesc.entry_error(exc, where, fqn) from None
    return Metadata(state_dict_metadata=entries, planner_data=checked.paths, storage_data=stored), stored


def _entry(
    fqn: str, entry: dcpdesc.Entry, stored: dict[MetadataIndex, Stored]
) -> TensorStorageMetadata | BytesStorageMetadata:
    if entry.dtype is None:
        c = entry.chunks[0]
        stored[MetadataIndex(fqn)] = Stored(c.file, c.offset, c.length)
        return BytesStorageMetadata()
    dtype = torch_dtype(entry.dtype)
    out = []
    for c in entry.chunks:
        stored[MetadataIndex(fqn, c.offsets)] = Stored(c.file, c.offset, c.length, dtype, tuple(c.sizes))
        out.append(ChunkStorageMetadata(offsets=torch.Size(c.offsets), sizes=torch.Size(c.sizes)))
    return TensorStorageMetadata(
        properties=TensorProperties(dtype=dtype), size=torch.Size(entry.size), chunks=out
    )
