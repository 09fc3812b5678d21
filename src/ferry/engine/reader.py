"""Verify and load a checkpoint: sizes, checksums, manifest; then tensors on any device.

Loading into live objects (``into``) reads each big tensor's bytes straight into the live
tensor that will receive it, where dtype, shape and device agree: no second buffer to
allocate and fault in, no copy afterwards. The checksum still covers every byte; if it
fails, those live tensors hold part of the damaged data until the fallback checkpoint
(if any) is loaded over them, and the error says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from ferry.engine.format import DTYPE_NAMES, _safe_np_dtype, is_stateful, torch_dtype
from ferry.engine.manifest import FileEntry, Manifest, TensorRecord, decode_manifest
from ferry.engine.manifest import decode_tree as decode_tree
from ferry.engine.placement import CHUNK, DIRECT_MIN, Bounce, Owner, plan_file
from ferry.engine.snapshot import byte_view
from ferry.errors import CorruptCheckpointError, FerryError
from ferry.storage import Reader, Storage
from ferry.storage.atomic import MANIFEST
from ferry.storage.pools import submit

_hash_pool = ThreadPoolExecutor(1, thread_name_prefix="ferry-verify")

MAX_MANIFEST = 256 << 20
"""The largest manifest read (a million tensors take about 200 MB); a bigger one is refused
before it is read, whatever memory it would take to decode."""


def _unreadable(where: str, exc: OSError) -> CorruptCheckpointError:
    """An OS error on a checkpoint's file (permission, a folder where a file should be, a
    bad sector): the checkpoint cannot be used, so the next older one is tried."""
    return CorruptCheckpointError(f"cannot read {where}: {exc.strerror or exc}; the checkpoint is unreadable")


@dataclass
class Loaded:
    """A checkpoint read back: the decoded state tree, its step, and where it came from.

    Tensors that were read straight into the live objects given as ``into`` are those
    live tensors (detached); every other tensor owns memory of exactly its own size
    (``engine.placement``), except tensors that share bytes in the file, which share one
    buffer as they did when saved."""

    state: Any
    step: int
    url: str
    manifest: Manifest


def read_manifest(storage: Storage, name: str) -> Manifest:
    """The manifest of checkpoint ``name``, checked whole (engine/manifest.py) before any
    of its data is read."""
    where = storage.child_url(name)
    rel = f"{name}/{MANIFEST}"
    try:
        if storage.size(rel) > MAX_MANIFEST:
            raise CorruptCheckpointError(
                f"{where}: manifest.json is larger than {MAX_MANIFEST >> 20} MiB; not ferry's, refused"
            )
        data = storage.read_bytes(rel)
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{where}: manifest.json is missing") from exc
    except OSError as exc:
        raise _unreadable(storage.child_url(rel), exc) from exc
    if len(data) > MAX_MANIFEST:  # it grew after it was measured
        raise CorruptCheckpointError(f"{where}: manifest.json changed while it was read")
    return decode_manifest(data, where)


def _cut(view: memoryview) -> Iterator[memoryview]:
    for start in range(0, len(view), CHUNK):
        yield view[start : start + CHUNK]


def open_checked(storage: Storage, name: str, file: str, meta: FileEntry) -> Reader:
    """Open a data file of checkpoint ``name`` for reading, once its size on disk is the
    manifest's: called before anything is allocated for its bytes, so a manifest cannot
    make a reader allocate more than the files hold."""
    rel = f"{name}/{file}"
    where = storage.child_url(rel)
    size = int(meta["size"])
    try:
        actual = storage.size(rel)
        if actual != size:
            raise CorruptCheckpointError(f"{where} is {actual} bytes, manifest says {size} (truncated)")
        return storage.open_reader(rel)
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{where} is missing") from exc
    except OSError as exc:
        raise _unreadable(where, exc) from exc


def _stream(
    storage: Storage,
    name: str,
    file: str,
    meta: FileEntry,
    dests: Iterable[memoryview],
    live: bool = False,
    filled: Callable[[int], None] | None = None,
    reader: Reader | None = None,
) -> None:
    """Read one data file, in order, into ``dests`` (which cover it exactly), verifying its
    size and checksum; ``filled(k)`` is called once destination ``k`` holds its bytes.
    Hashing a piece overlaps reading the next (both release the GIL), so a destination
    must not be reused by the piece right after it. ``reader``: the file, opened already
    by ``open_checked``."""
    where = storage.child_url(f"{name}/{file}")
    size = int(meta["size"])
    if reader is None:
        reader = open_checked(storage, name, file, meta)
    hasher = xxhash.xxh3_64()
    pending: Future[None] | None = None
    pos = 0
    try:
        for k, dest in enumerate(dests):
            got = 0
            while got < len(dest):
                n = reader.readinto(dest[got:])
                if n <= 0:
                    raise CorruptCheckpointError(f"{where} ended early at byte {pos + got}")
                got += n
            if filled is not None:
                filled(k)
            if pending is not None:
                pending.result()
            pending = submit(_hash_pool, hasher.update, dest)
            pos += got
    except OSError as exc:
        raise _unreadable(where, exc) from exc
    finally:
        if pending is not None:
            pending.result()
        reader.close()
    if pos != size:  # the plan covers the file; this is ferry's own check, not the file's
        raise FerryError(f"{where}: read {pos} of {size} bytes (a bug in ferry's read plan)")
    if hasher.hexdigest() != meta.get("xxh3_64"):
        note = " (the live tensors it was loading into got part of it)" if live else ""
        raise CorruptCheckpointError(f"{where}: checksum mismatch (the file was damaged){note}")


def read_file(
    storage: Storage, name: str, file: str, meta: FileEntry, into: torch.Tensor | None = None
) -> torch.Tensor:
    """Read one data file into one host buffer (``into``, or a new one), verified."""
    size = int(meta["size"])
    reader = open_checked(storage, name, file, meta)
    try:
        buf = into if into is not None else torch.empty(size, dtype=torch.uint8)
    except BaseException:
        reader.close()
        raise
    _stream(
        storage, name, file, meta, _cut(byte_view(buf)[:size] if size else memoryview(b"")), reader=reader
    )
    return buf


def verify(storage: Storage, name: str) -> Manifest:
    """Check the manifest and every file; raises CorruptCheckpointError, returns the manifest.
    Reads through two small buffers: verifying costs no memory of the checkpoint's size."""
    manifest = read_manifest(storage, name)
    bounce = [memoryview(bytearray(CHUNK)), memoryview(bytearray(CHUNK))]
    for file, meta in manifest["files"].items():
        size = int(meta["size"])
        dests = (bounce[k % 2][: min(CHUNK, size - at)] for k, at in enumerate(range(0, size, CHUNK)))
        _stream(storage, name, file, meta, dests)
    return manifest


def live_targets(tree: Any, into: Any, entries: list[TensorRecord]) -> dict[int, torch.Tensor]:
    """Tensor index -> the live CPU tensor of ``into`` at the same place in the tree that
    can take the checkpoint's bytes as they are (same dtype, shape; contiguous)."""
    found: dict[int, torch.Tensor] = {}
    claimed: set[int] = set()

    def take(index: Any, live: torch.Tensor) -> None:
        if not isinstance(index, int) or not 0 <= index < len(entries) or index in found:
            return
        e = entries[index]
        fits = (
            e["kind"] == "torch"
            and e["nbytes"] >= DIRECT_MIN
            and DTYPE_NAMES.get(live.dtype) == e["dtype"]
            and list(live.shape) == e["shape"]
            and live.device.type == "cpu"
            and live.is_contiguous()
            and not live.is_conj()
            and not live.is_neg()
        )
        if fits and live.data_ptr() not in claimed:
            claimed.add(live.data_ptr())  # tied weights: one read, the other is copied
            found[index] = live.detach()

    def walk(node: Any, live: Any) -> None:
        if is_stateful(live):
            if isinstance(node, dict) and "__stateful__" in node:
                try:
                    sd = live.state_dict()
                except Exception:  # its load_state_dict gets the state as usual
                    return
                walk(node.get("state"), sd)
        elif isinstance(live, torch.Tensor):
            if isinstance(node, dict) and "__tensor__" in node:
                take(node["__tensor__"], live)
        elif isinstance(live, dict) and isinstance(node, dict):
            if "__dict__" in node:
                pairs = node["__dict__"] if isinstance(node["__dict__"], list) else []
                for pair in pairs:
                    ok = isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], (int, str))
                    if ok and pair[0] in live:
                        walk(pair[1], live[pair[0]])
            elif not any(k.startswith("__") for k in node):
                for k, v in node.items():
                    if k in live:
                        walk(v, live[k])
        elif isinstance(live, (list, tuple)):
            items = node.get("__tuple__") if isinstance(node, dict) else node
            if isinstance(items, list):
                for n, x in zip(items, live, strict=False):
                    walk(n, x)

    walk(tree, into)
    return found


def _disjoint(entries: list[TensorRecord]) -> bool:
    """No two tensors share bytes of a file (always so when ferry wrote it; live tensors
    are read into only then, each from bytes of its own)."""
    ranges = sorted((e["file"], e["offset"], e["offset"] + e["nbytes"]) for e in entries if e["nbytes"])
    return all(a[0] != b[0] or a[2] <= b[1] for a, b in itertools.pairwise(ranges))


def decode_array(raw: torch.Tensor, entry: TensorRecord) -> Any:
    """A tensor entry (checked by ``check_tensors``) over its bytes ``raw``, without a copy."""
    if entry["kind"] == "numpy":
        return raw.numpy().view(_safe_np_dtype(entry["dtype"])).reshape(entry["shape"])
    return raw.view(torch_dtype(entry["dtype"])).reshape(entry["shape"])


def read_arrays(
    storage: Storage,
    name: str,
    files: Mapping[str, FileEntry],
    entries: list[TensorRecord],
    device: torch.device,
    targets: dict[int, torch.Tensor] | None = None,
) -> list[Any]:
    """Read and verify ``files`` of checkpoint ``name``: the arrays of ``entries`` (checked
    by ``engine.manifest``), each in memory of its own (``engine.placement``); those in
    ``targets`` are read straight into those live tensors."""
    targets = targets or {}
    bounce = Bounce()
    owners: dict[int, Owner] = {}
    values: dict[int, torch.Tensor] = {}
    for file, meta in files.items():
        reader = open_checked(storage, name, file, meta)  # before planning allocates
        try:
            plan = plan_file(entries, file, int(meta["size"]), targets, bounce)
        except BaseException:
            reader.close()
            raise
        live = any(entries[i]["file"] == file for i in targets)
        _stream(storage, name, file, meta, plan.pieces, live=live, filled=plan.filled, reader=reader)
        owners.update(plan.owners)
        values.update(plan.values)
    arrays: list[Any] = []
    for i, e in enumerate(entries):
        if i in targets:
            arrays.append(targets[i])
            continue
        if i in values:
            value = values[i]
        else:
            buf, at = owners[i]
            value = decode_array(buf[at : at + e["nbytes"]], e)
        arrays.append(value if e["kind"] == "numpy" or device.type == "cpu" else value.to(device))
    return arrays


def load_one(
    storage: Storage, name: str, target_device: str | torch.device = "cpu", into: Any = None
) -> Loaded:
    """Read, verify and decode one checkpoint; with ``into``, big CPU tensors are read
    straight into their live counterparts (``target_device`` must then be the CPU)."""
    manifest = read_manifest(storage, name)
    where = storage.child_url(name)
    device = torch.device(target_device)
    entries: list[TensorRecord] = manifest["tensors"]
    targets: dict[int, torch.Tensor] = {}
    if into is not None and device.type == "cpu" and _disjoint(entries):
        targets = live_targets(manifest["tree"], into, entries)
    arrays = read_arrays(storage, name, manifest["files"], entries, device, targets)
    return Loaded(decode_tree(manifest, arrays, where), int(manifest["step"]), where, manifest)
