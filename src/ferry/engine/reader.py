"""Verify and load a checkpoint: sizes, checksums, manifest; then tensors on any device.

Loading into live objects (``into``) reads each big tensor's bytes straight into the live
tensor that will receive it, where dtype, shape and device agree: no second buffer to
allocate and fault in, no copy afterwards. The checksum still covers every byte; if it
fails, those live tensors hold part of the damaged data until the fallback checkpoint
(if any) is loaded over them, and the error says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ferry.engine.codec import DTYPE_NAMES, TORCH_LEAVES, is_stateful, torch_dtype
from ferry.engine.placement import DIRECT_MIN, Bounce, Owner, plan_file
from ferry.engine.snapshot import byte_view
from ferry.format.integrity import chunks, open_checked, stream_file
from ferry.format.integrity import read_manifest as read_manifest
from ferry.format.integrity import verify as verify
from ferry.format.manifest import FileEntry, Manifest, TensorRecord, decode_tree
from ferry.format.wire import safe_np_dtype
from ferry.storage import Storage


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
    dests = chunks(byte_view(buf)[:size] if size else memoryview(b""))
    stream_file(storage, name, file, meta, dests, reader=reader)
    return buf


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
        return raw.numpy().view(safe_np_dtype(entry["dtype"])).reshape(entry["shape"])
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
    by ``format.manifest``), each in memory of its own (``engine.placement``); those in
    ``targets`` are read straight into those live tensors."""
    targets = targets or {}
    bounce = Bounce()
    owners: dict[int, Owner] = {}
    arrays: list[Any] = [None] * len(entries)
    for file, meta in files.items():
        reader = open_checked(storage, name, file, meta)  # before planning allocates
        try:
            plan = plan_file(entries, file, int(meta["size"]), targets, bounce, arrays)
        except BaseException:
            reader.close()
            raise
        live = any(entries[i]["file"] == file for i in targets)
        stream_file(storage, name, file, meta, plan.pieces, live=live, filled=plan.filled, reader=reader)
        owners.update(plan.owners)
    for i, target in targets.items():
        arrays[i] = target
    for i, (buf, at) in owners.items():
        arrays[i] = decode_array(buf[at : at + entries[i]["nbytes"]], entries[i])
    if device.type != "cpu":  # (there are no targets then: into= reads into the CPU only)
        arrays = [a if e["kind"] == "numpy" or i in targets else a.to(device)
                  for i, (a, e) in enumerate(zip(arrays, entries, strict=True))]  # fmt: skip
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
    return Loaded(decode_tree(manifest, arrays, where, TORCH_LEAVES), int(manifest["step"]), where, manifest)
