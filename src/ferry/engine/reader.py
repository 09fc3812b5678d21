"""Verify and load a checkpoint: sizes, checksums, manifest; then tensors on any device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xxhash

from ferry.engine.format import parse_manifest, torch_dtype, unflatten
from ferry.engine.snapshot import byte_view
from ferry.errors import CorruptCheckpointError, StorageError
from ferry.storage import Storage
from ferry.storage.atomic import MANIFEST

CHUNK = 16 << 20


@dataclass
class Loaded:
    """A checkpoint read back: the decoded state tree, its step, and where it came from."""

    state: Any
    step: int
    url: str
    manifest: dict[str, Any]


def read_manifest(storage: Storage, name: str) -> dict[str, Any]:
    where = storage.child_url(name)
    try:
        data = storage.read_bytes(f"{name}/{MANIFEST}")
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{where}: manifest.json is missing") from exc
    return parse_manifest(data, where)


def read_file(storage: Storage, name: str, file: str, meta: dict[str, Any],
              into: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """Read one data file into a host buffer, verifying its size and checksum."""
    where = storage.child_url(f"{name}/{file}")
    size = int(meta["size"])
    try:
        actual = storage.size(f"{name}/{file}")
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{where} is missing") from exc
    if actual != size:
        raise CorruptCheckpointError(f"{where} is {actual} bytes, manifest says {size} (truncated)")
    buf = into if into is not None else torch.empty(size, dtype=torch.uint8)
    view = byte_view(buf) if size else memoryview(b"")
    hasher = xxhash.xxh3_64()
    reader = storage.open_reader(f"{name}/{file}")
    try:
        pos = 0
        while pos < size:
            n = reader.readinto(view[pos : min(pos + CHUNK, size)])
            if n <= 0:
                raise CorruptCheckpointError(f"{where} ended early at byte {pos}")
            hasher.update(view[pos : pos + n])
            pos += n
    except OSError as exc:
        raise StorageError(f"cannot read {where}: {exc}") from exc
    finally:
        reader.close()
    if hasher.hexdigest() != meta.get("xxh3_64"):
        raise CorruptCheckpointError(f"{where}: checksum mismatch (the file was damaged)")
    return buf


def verify(storage: Storage, name: str) -> dict[str, Any]:
    """Check the manifest and every file; raises CorruptCheckpointError, returns the manifest."""
    manifest = read_manifest(storage, name)
    for file, meta in manifest["files"].items():
        read_file(storage, name, file, meta)
    return manifest


def load_one(storage: Storage, name: str, target_device: str | torch.device = "cpu") -> Loaded:
    manifest = read_manifest(storage, name)
    buffers = {f: read_file(storage, name, f, m) for f, m in manifest["files"].items()}
    device = torch.device(target_device)
    arrays: list[Any] = []
    for i, e in enumerate(manifest["tensors"]):
        buf = buffers.get(e["file"])
        end = int(e["offset"]) + int(e["nbytes"])
        if buf is None or end > buf.numel() or int(e["offset"]) < 0:
            raise CorruptCheckpointError(f"{storage.child_url(name)}: tensor {i} lies outside its file")
        raw = buf[int(e["offset"]) : end]
        shape = [int(s) for s in e["shape"]]
        if e["kind"] == "numpy":
            from ferry.engine.format import _safe_np_dtype

            arrays.append(np.frombuffer(raw.numpy().tobytes(), _safe_np_dtype(e["dtype"])).reshape(shape))
            continue
        t = raw.view(torch_dtype(e["dtype"])).reshape(shape)
        arrays.append(t if device.type == "cpu" else t.to(device, non_blocking=False))
    state = unflatten(manifest["tree"], arrays)
    return Loaded(state, int(manifest["step"]), storage.child_url(name), manifest)
