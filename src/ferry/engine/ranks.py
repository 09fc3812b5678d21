"""Checkpoints of multi-rank jobs: the shared state once, each rank's own part beside it.

Folder of a checkpoint saved by W ranks::

    data-0.bin, manifest.json   rank 0: the replicated state (a DDP model, its optimizer)
                                and rank 0's own part
    rank-R.bin, rank-R.json     rank R >= 1: its own part (RNG streams, data position,
                                gradients, and its whole state when nothing is replicated)

Every rank writes its files into one staging folder named by rank 0; rank 0 gathers their
checksums, writes the manifest that lists every file, and commits. A checkpoint is thus
complete or invisible. Every call here is a collective made on the training thread.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch
import xxhash

from ferry.engine import sharded
from ferry.engine.catalog import apply_retention, split_url
from ferry.engine.format import flatten, manifest_bytes, unflatten
from ferry.engine.persist import CheckpointInfo, build_manifest, next_name, write_hashed
from ferry.engine.reader import Loaded, check_part, read_arrays, read_file
from ferry.engine.snapshot import HostBuffer, byte_view, snapshot
from ferry.errors import CorruptCheckpointError, FerryError, StorageError
from ferry.runtime.distributed import RankGroup
from ferry.storage import open_storage, strategy_for
from ferry.storage.atomic import MANIFEST


def _write_part(storage: Any, staging: str, rank: int, state: Any) -> tuple[Any, dict[str, Any], int]:
    flat = flatten(state)
    host, size = snapshot(flat, HostBuffer())
    data = "data-0.bin" if rank == 0 else f"rank-{rank}.bin"
    for entry in flat.entries:
        entry.file = data
    files = {data: {"size": size, "xxh3_64": write_hashed(storage, f"{staging}/{data}", byte_view(host))}}
    if rank:
        doc = json.dumps({"tree": flat.tree, "tensors": [e.to_json() for e in flat.entries]}).encode()
        storage.write_bytes(f"{staging}/rank-{rank}.json", doc)
        files[f"rank-{rank}.json"] = {"size": len(doc), "xxh3_64": xxhash.xxh3_64_hexdigest(doc)}
    return flat, files, size


def _write_sharded(
    storage: Any, staging: str, rank: int, shards: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, bool]]:
    """DCP writes the sharded models; each rank then checksums the files it wrote."""
    folder = storage.local_path(f"{staging}/{sharded.DCP_DIR}")
    if folder is None:
        raise StorageError(
            f"sharded (FSDP) state needs a local or shared-filesystem checkpoint directory, "
            f"not {storage.url}: stage it locally and transfer it"
        )
    with_optim = sharded.save(shards, folder)
    files = {}
    for name in sharded.written_by(folder, rank):
        with open(os.path.join(folder, name), "rb") as f:
            blob = f.read()
        files[f"{sharded.DCP_DIR}/{name}"] = {"size": len(blob), "xxh3_64": xxhash.xxh3_64_hexdigest(blob)}
    return files, with_optim


def save_ranked(
    url: str,
    group: RankGroup,
    state: Any,
    *,
    step: int,
    meta: dict[str, Any] | None,
    keep_last: int | None,
    keep_every: int | None,
    shards: dict[str, Any] | None = None,
) -> CheckpointInfo:
    """Every rank calls this with its own ``state`` (rank 0's includes the shared part), and
    the same sharded models in ``shards`` (saved collectively through DCP)."""
    t0 = time.perf_counter()
    storage = open_storage(url)
    strategy = strategy_for(storage)
    plan: dict[str, Any] = {}
    if group.rank == 0:
        try:
            storage.makedirs("")
            final = next_name(storage.listdir(), step)
            plan = {"final": final, "staging": strategy.staging_name(final)}
            storage.makedirs(plan["staging"])
        except FerryError as exc:
            plan = {"error": str(exc)}
    plan = group.broadcast(plan)
    if "error" in plan:
        raise StorageError(plan["error"])
    mine: dict[str, Any]
    try:
        dcp_files: dict[str, Any] = {}
        if shards:
            dcp_files, with_optim = _write_sharded(storage, plan["staging"], group.rank, shards)
            state = {**state, "ferry": {**state["ferry"], "sharded_optimizers": with_optim}}
        flat, files, size = _write_part(storage, plan["staging"], group.rank, state)
        files.update(dcp_files)
        mine = {"files": files, "size": size + sum(int(m["size"]) for m in dcp_files.values())}
    except FerryError as exc:
        mine = {"error": f"rank {group.rank}: {exc}"}
    everyone = group.gather(mine)
    outcome: dict[str, Any] = {}
    if everyone is not None:
        outcome = _commit(storage, plan, everyone, flat if "files" in mine else None, step, meta, group)
        if "url" in outcome and keep_last:
            apply_retention(storage, keep_last, keep_every)
    outcome = group.broadcast(outcome)
    if "error" in outcome:
        raise StorageError(f"the checkpoint of step {step} was not committed: {outcome['error']}")
    seconds = time.perf_counter() - t0
    return CheckpointInfo(outcome["url"], step, int(outcome["bytes"]), seconds, seconds)


def _commit(
    storage: Any,
    plan: dict[str, Any],
    everyone: list[dict[str, Any]],
    flat: Any,
    step: int,
    meta: dict[str, Any] | None,
    group: RankGroup,
) -> dict[str, Any]:
    errors = [part["error"] for part in everyone if "error" in part]
    if errors or flat is None:
        storage.remove(plan["staging"])
        return {"error": "; ".join(errors)}
    try:
        files = {name: m for part in everyone for name, m in part["files"].items()}
        body = build_manifest(flat, step, files, meta, group.world_size)
        storage.write_bytes(f"{plan['staging']}/{MANIFEST}", manifest_bytes(body))
        strategy_for(storage).commit(storage, plan["staging"], plan["final"])
    except FerryError as exc:
        storage.remove(plan["staging"])
        return {"error": str(exc)}
    return {"url": storage.child_url(plan["final"]), "bytes": sum(int(p["size"]) for p in everyone)}


def rank_part(loaded: Loaded, rank: int) -> Any:
    """Rank ``rank``'s own part of a multi-rank checkpoint (rank 0's is in the main tree)."""
    storage, name = split_url(loaded.url)
    assert name is not None
    files = loaded.manifest["files"]
    key = f"rank-{rank}.json"
    if key not in files:
        raise CorruptCheckpointError(f"{loaded.url} has no part for rank {rank}")
    try:
        doc = json.loads(read_file(storage, name, key, files[key]).numpy().tobytes())
    except ValueError as exc:
        raise CorruptCheckpointError(f"{loaded.url}/{key} is not valid JSON") from exc
    data_file = f"rank-{rank}.bin"
    if not isinstance(doc, dict) or data_file not in files:
        raise CorruptCheckpointError(f"{loaded.url}/{key} is not a rank part of this checkpoint")
    check_part(doc, {data_file: files[data_file]}, f"{loaded.url}/{key}")
    arrays = read_arrays(storage, name, {data_file: files[data_file]}, doc["tensors"], torch.device("cpu"))
    return unflatten(doc["tree"], arrays)
