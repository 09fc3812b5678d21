"""Verify and load a checkpoint: sizes, checksums, manifest; then tensors on any device.

Loading into live objects (``into``) reads each big tensor's bytes straight into the live
tensor that will receive it, where dtype, shape and device agree: no second buffer to
allocate and fault in, no copy afterwards. The checksum still covers every byte; if it
fails, those live tensors hold part of the damaged data until the fallback checkpoint
(if any) is loaded over them, and the error says so.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

from ferry.engine.format import DTYPE_NAMES, TORCH_LEAVES, is_stateful, safe_np_dtype, torch_dtype
from ferry.engine.integrity import CHUNK, chunks, stream_file
from ferry.engine.integrity import read_manifest as read_manifest
from ferry.engine.integrity import verify as verify
from ferry.engine.manifest import FileEntry, Manifest, TensorRecord, decode_tree
from ferry.engine.snapshot import byte_view, tensor_bytes
from ferry.storage import Storage

DIRECT_MIN = 256 << 10
"""Tensors below this are read into the load buffer and copied: not worth a read call."""


@dataclass
class Loaded:
    """A checkpoint read back: the decoded state tree, its step, and where it came from.

    Tensors that were read straight into the live objects given as ``into`` are those
    live tensors (detached); the others are views of one fresh host buffer."""

    state: Any
    step: int
    url: str
    manifest: Manifest


def read_file(
    storage: Storage, name: str, file: str, meta: FileEntry, into: torch.Tensor | None = None
) -> torch.Tensor:
    """Read one data file into one host buffer (``into``, or a new one), verified."""
    size = int(meta["size"])
    buf = into if into is not None else torch.empty(size, dtype=torch.uint8)
    stream_file(storage, name, file, meta, chunks(byte_view(buf)[:size] if size else memoryview(b"")))
    return buf


Owner = tuple[torch.Tensor, int]
"""The fresh host buffer a tensor was read into, and its offset there."""


def _plan(
    entries: list[TensorRecord], file: str, size: int, targets: dict[int, torch.Tensor]
) -> tuple[list[memoryview], dict[int, Owner]]:
    """Where each byte of ``file`` goes: a live tensor (``targets``), a fresh buffer of its
    own for every other big tensor, one fresh buffer per run of small neighbours; padding
    to throwaway scratch. Each tensor then owns just its bytes: nothing holds on to one
    buffer of the checkpoint's size (``torch.save`` of a loaded optimizer would write all
    of it), and the pages of the live tensors are never allocated twice."""
    order = sorted(
        (i for i, e in enumerate(entries) if e["file"] == file), key=lambda i: entries[i]["offset"]
    )
    dests: list[memoryview] = []
    owners: dict[int, Owner] = {}
    run: list[int] = []
    pos = 0

    def skip_to(upto: int) -> None:
        nonlocal pos
        while pos < upto:  # fresh scratch each time: the previous piece may still be hashed
            n = min(CHUNK, upto - pos)
            dests.append(memoryview(bytearray(n)))
            pos += n

    def take(first: int, end: int, idx: list[int]) -> None:
        nonlocal pos
        skip_to(first)
        buf = torch.empty(end - first, dtype=torch.uint8)
        for i in idx:
            owners[i] = (buf, entries[i]["offset"] - first)
        dests.extend(chunks(byte_view(buf)))
        pos = end

    def flush() -> None:
        if run:
            last = entries[run[-1]]
            take(entries[run[0]]["offset"], last["offset"] + last["nbytes"], list(run))
            run.clear()

    for i in order:
        e = entries[i]
        if i in targets:
            flush()
            skip_to(e["offset"])
            dests.extend(chunks(tensor_bytes(targets[i])))
            pos = e["offset"] + e["nbytes"]
        elif e["nbytes"] >= DIRECT_MIN:
            flush()
            take(e["offset"], e["offset"] + e["nbytes"], [i])
        elif e["nbytes"] == 0:
            owners[i] = (torch.empty(0, dtype=torch.uint8), 0)
        else:
            run.append(i)
    flush()
    skip_to(size)
    return dests, owners


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
    """No two tensors share bytes of a file (always so when ferry wrote it)."""
    ranges = sorted((e["file"], e["offset"], e["offset"] + e["nbytes"]) for e in entries if e["nbytes"])
    return all(a[0] != b[0] or a[2] <= b[1] for a, b in itertools.pairwise(ranges))


def decode_array(raw: torch.Tensor, entry: TensorRecord) -> Any:
    """A tensor entry (checked by ``check_tensors``) over its bytes ``raw``, without a copy."""
    if entry["kind"] == "numpy":
        return raw.numpy().view(safe_np_dtype(entry["dtype"])).reshape(entry["shape"])
    return raw.view(torch_dtype(entry["dtype"])).reshape(entry["shape"])


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
    owners: dict[int, Owner] = {}
    if _disjoint(entries):
        if into is not None and device.type == "cpu":
            targets = live_targets(manifest["tree"], into, entries)
        for file, meta in manifest["files"].items():
            dests, placed = _plan(entries, file, int(meta["size"]), targets)
            stream_file(
                storage, name, file, meta, dests, live=any(entries[i]["file"] == file for i in targets)
            )
            owners.update(placed)
    else:  # tensors sharing bytes: never written by ferry, but readable
        buffers = {f: read_file(storage, name, f, m) for f, m in manifest["files"].items()}
        owners = {i: (buffers[e["file"]], e["offset"]) for i, e in enumerate(entries)}
    arrays: list[Any] = []
    for i, e in enumerate(entries):
        if i in targets:
            arrays.append(targets[i])
            continue
        buf, at = owners[i]
        value = decode_array(buf[at : at + e["nbytes"]], e)
        arrays.append(value if e["kind"] == "numpy" or device.type == "cpu" else value.to(device))
    return Loaded(decode_tree(manifest, arrays, where, TORCH_LEAVES), int(manifest["step"]), where, manifest)
