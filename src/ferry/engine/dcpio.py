"""Ferry's own storage for torch.distributed.checkpoint (DCP): nothing on it is a pickle.

DCP plans a save or a load of a sharded state dict across ranks (which rank writes which
chunk; which chunks a rank reads to fill its shards, resharding included) and leaves the
bytes to a ``StorageWriter``/``StorageReader`` and the values to a planner. DCP's own
ones pickle: ``.metadata`` is a pickle, each chunk a ``torch.save``, and the default load
planner unpickles every non-tensor value with ``weights_only=False``, so a crafted
checkpoint runs code when it is loaded. Here instead, in the ``dcp/`` folder:

    metadata.json   rank 0: the description (format/dcpdesc.py), JSON with a checksum
    shards-R.bin    rank R: its chunks, raw bytes, and its plain values (an optimizer's
                    lr, betas, ...) in ferry's wire format (JSON with wire.py's tags)

and ferry's manifest lists and checksums each of them. The calls, in DCP's order, by rank:

    save  (all) reset, set_up_storage_writer, prepare_local_plan; (rank 0)
          prepare_global_plan: each rank's file name; (all) write_data; (rank 0) finish:
          the description
    load  (before DCP, every rank) ``read_description``; (all) read_metadata: that
          description, set_up_storage_reader, prepare_local_plan; (rank 0)
          prepare_global_plan; (all) read_data

The description is read and checked before ``dcp.load`` starts, so a bad one is one ferry
error on every rank, not a failure inside DCP's collectives. ``Reader.read_data`` works
only with ``LoadPlanner``, the planner that decodes values without unpickling.
Works with torch >= 2.4 (the StorageWriter/StorageReader protocol of that release;
later releases pass extra keyword arguments, taken and ignored here).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    ReadItem,
    SavePlan,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner import LoadPlanner as _LoadPlanner
from torch.distributed.checkpoint.planner import SavePlanner as _SavePlanner
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from ferry.engine import dcpmeta
from ferry.engine.codec import DTYPE_NAMES, flatten, unflatten
from ferry.engine.dcpmeta import Stored
from ferry.errors import CorruptCheckpointError, FerryError, UnsafeCheckpointError, UnsupportedStateError
from ferry.format.dcpdesc import METADATA, shards_file
from ferry.format.integrity import MAX_MANIFEST
from ferry.format.manifest import check_depth

_WRITE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


# ------------------------------------------------------------------------- plain values


def encode_value(value: object, fqn: str) -> bytes:
    """A non-tensor entry of the state dict (a number, a tuple, a list of names) in ferry's
    wire format; tensors are DCP's own items, so a value holding one is refused."""
    flat = flatten(value)
    if flat.arrays:
        raise UnsupportedStateError(
            f"sharded state entry {fqn} mixes tensors into a plain value; ferry cannot save it"
        )
    return json.dumps(flat.tree, separators=(",", ":")).encode()


def decode_value(data: bytes, where: str) -> object:
    """What ``encode_value`` wrote, checked as a manifest's tree is: JSON and wire.py's
    closed set of tags, never a pickle."""
    try:
        tree = json.loads(data)
        check_depth(tree, where)
        return unflatten(tree, [])
    except FerryError:
        raise
    except (ValueError, UnicodeDecodeError, RecursionError, TypeError, KeyError) as exc:
        pickled = data[:1] == b"\x80" or data[:2] == b"PK"
        why = (
            "is a pickle; ferry never unpickles"
            if pickled
            else f"is not a value ferry wrote ({type(exc).__name__})"
        )
        raise UnsafeCheckpointError(f"{where} {why}; refused") from None


class SavePlanner(DefaultSavePlanner):
    """DCP's default planning; values are resolved to ferry's wire format, not torch.save."""

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        if write_item.type == WriteItemType.BYTE_IO:
            value = self.lookup_object(write_item.index)
            return io.BytesIO(encode_value(value, write_item.index.fqn))
        return super().resolve_data(write_item)


class LoadPlanner(DefaultLoadPlanner):
    """DCP's default planning; values are decoded from ferry's wire format, never unpickled."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        decoded = decode_value(value.getvalue(), f"sharded value {fqn!r}")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], decoded)
        else:
            self.state_dict[fqn] = decoded


def _done(value: Any) -> Future[Any]:
    fut: Future[Any] = Future()
    fut.set_result(value)
    return fut


# ------------------------------------------------------------------------------- writing


@dataclasses.dataclass(frozen=True)
class _RankFile:
    """A rank's file name, given to it by the coordinator through its plan."""

    name: str


class Writer(StorageWriter):
    """Writes into ``folder`` (a local folder of the staging checkpoint), durably (fsync);
    the files become visible with the checkpoint's commit."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = folder

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.folder = os.fspath(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        os.makedirs(self.folder, exist_ok=True)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [dataclasses.replace(p, storage_data=_RankFile(shards_file(i))) for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: _SavePlanner) -> Future[list[WriteResult]]:
        if not isinstance(plan.storage_data, _RankFile):
            raise FerryError("ferry's DCP writer got a plan its coordinator did not name a file in (a bug)")
        name = plan.storage_data.name
        results: list[WriteResult] = []
        with _created(os.path.join(self.folder, name)) as f:
            for item in plan.items:
                data = planner.resolve_data(item)
                offset = f.tell()
                if isinstance(data, io.BytesIO):
                    f.write(data.getbuffer())
                    where = Stored(name, offset, f.tell() - offset)
                else:
                    where = _write_tensor(f, data, name, item.index.fqn)
                results.append(WriteResult(index=item.index, size_in_bytes=where.length, storage_data=where))
        return _done(results)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        stored = {r.index: r.storage_data for rank in results for r in rank}
        with _created(os.path.join(self.folder, METADATA)) as f:
            f.write(dcpmeta.encode(metadata, stored))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never picked by DCP on its own: ferry passes it explicitly


def _write_tensor(f: io.BufferedWriter, t: torch.Tensor, name: str, fqn: str) -> Stored:
    t = t.detach()
    if t.dtype not in DTYPE_NAMES or t.layout != torch.strided:
        raise UnsupportedStateError(
            f"sharded tensor {fqn} is {t.dtype}, {t.layout}; ferry saves dense tensors of standard dtypes"
        )
    t = t.to("cpu").contiguous()
    offset = f.tell()
    if t.numel():
        f.write(t.reshape(-1).view(torch.uint8).numpy().data)
    return Stored(name, offset, f.tell() - offset, t.dtype, tuple(t.shape))


@contextmanager
def _created(path: str) -> Iterator[io.BufferedWriter]:
    """A new file (never an existing one or a link), flushed to disk when the block ends."""
    with open(os.open(path, _WRITE, 0o600), "wb") as f:
        yield f
        f.flush()
        os.fsync(f.fileno())


# ------------------------------------------------------------------------------- reading


def read_description(folder: str) -> Metadata:
    """The checked description of the sharded state in ``folder`` (its ``metadata.json``)."""
    where = os.path.join(folder, METADATA)
    with _opened(where) as (fd, size):
        if size > MAX_MANIFEST:
            raise CorruptCheckpointError(f"{where} is over {MAX_MANIFEST >> 20} MiB; not ferry's, refused")
        data = _pread(fd, 0, size, where)
    metadata, _ = dcpmeta.decode(bytes(data), where)
    return metadata


class Reader(StorageReader):
    """Reads the chunks and values DCP asks for from ``folder``, as ``description`` (from
    ``read_description``) places them, each checked to lie inside its file."""

    def __init__(self, folder: str, description: Metadata) -> None:
        super().__init__()
        self.folder = folder
        self.description = description

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None and os.fspath(checkpoint_id) != self.folder:
            raise FerryError("ferry's DCP reader reads the folder it was made for only (a bug)")

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self.description

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: _LoadPlanner) -> Future[None]:
        if not isinstance(planner, LoadPlanner):
            raise UnsafeCheckpointError(
                "ferry's DCP reader works with its own planner only (it never unpickles)"
            )
        stored: dict[MetadataIndex, Stored] = self.description.storage_data
        by_file: dict[str, list[tuple[ReadItem, Stored]]] = {}
        for item in plan.items:
            where = stored.get(item.storage_index)
            if where is None:
                raise CorruptCheckpointError(f"{self.folder}: no chunk is placed at {item.storage_index}")
            by_file.setdefault(where.file, []).append((item, where))
        for name, items in by_file.items():
            path = os.path.join(self.folder, name)
            with _opened(path) as (fd, size):
                for item, where in items:
                    if where.offset + where.length > size:
                        raise CorruptCheckpointError(f"{path}: a chunk lies outside the file (truncated?)")
                    data = _pread(fd, where.offset, where.length, path)
                    if item.type == LoadItemType.BYTE_IO:
                        planner.load_bytes(item, io.BytesIO(data))
                    else:
                        _copy_chunk(planner, item, where, data, path)
        return _done(None)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False


def _copy_chunk(planner: LoadPlanner, item: ReadItem, where: Stored, data: bytearray, path: str) -> None:
    if where.dtype is None or where.sizes is None:  # a value's place, named by a tensor's read
        raise CorruptCheckpointError(f"{path}: {item.dest_index.fqn} is described as a value, not a tensor")
    if data:
        chunk = torch.frombuffer(data, dtype=where.dtype).reshape(where.sizes)
    else:
        chunk = torch.empty(where.sizes, dtype=where.dtype)
    for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths, strict=True)):
        chunk = chunk.narrow(dim, start, length)
    target = planner.resolve_tensor(item).detach()
    if target.shape != chunk.shape or target.dtype != chunk.dtype:
        raise CorruptCheckpointError(
            f"{path}: a chunk of {item.dest_index.fqn} is {chunk.dtype} {list(chunk.shape)}, the model's "
            f"{target.dtype} {list(target.shape)}: not this model's checkpoint"
        )
    target.copy_(chunk)
    planner.commit_tensor(item, target)


@contextmanager
def _opened(path: str) -> Iterator[tuple[int, int]]:
    """A regular file (not a link, FIFO or device), opened for reading, and its size."""
    try:
        fd = os.open(path, _READ)
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{path} is missing") from exc
    except OSError as exc:  # ELOOP: a link
        raise UnsafeCheckpointError(f"{path} cannot be opened as a file ({exc.strerror}); refused") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeCheckpointError(f"{path} is not a regular file; refused")
        yield fd, st.st_size
    finally:
        os.close(fd)


def _pread(fd: int, offset: int, length: int, path: str) -> bytearray:
    buf = bytearray(length)
    view, got = memoryview(buf), 0
    try:
        while got < length:
            n = os.preadv(fd, [view[got:]], offset + got)
            if n <= 0:
                raise CorruptCheckpointError(f"{path} ended early")
            got += n
    except OSError as exc:
        raise CorruptCheckpointError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return buf
