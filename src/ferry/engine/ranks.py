"""Checkpoints of multi-rank jobs: the shared state once, each rank's own part beside it.

Folder of a checkpoint saved by W ranks::

    data-0.bin, manifest.json   rank 0: the replicated state (a DDP model, its optimizer)
                                and rank 0's own part
    rank-R.bin, rank-R.json     rank R >= 1: its own part (RNG streams, data position,
                                gradients, and its whole state when nothing is replicated)
    user/..., rank-R/user/...   the files of a ``FunctionCheckpoint`` on rank 0, on rank R

Every rank writes its files into the staging folder of one commit transaction
(``ferry.storage.transaction``) that rank 0 began; rank 0 gathers their checksums, writes
the manifest that lists every file, and commits. A checkpoint is thus complete or
invisible. Every call here is a collective made on the training thread.

Any exception on any rank, ferry's or not, becomes that rank's error record: every rank
reaches the same collectives whatever happened, and every rank raises the same
StorageError naming the rank and the cause, at once (a rank that raised instead would
leave the others blocked in the next collective until the process group's timeout).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Protocol

import torch

from ferry.engine import sharded
from ferry.engine.catalog import apply_retention, split_url
from ferry.engine.format import Flattened, flatten, manifest_bytes, unflatten
from ferry.engine.manifest import parse_part
from ferry.engine.persist import CheckpointInfo, build_manifest, next_name
from ferry.engine.reader import Loaded, read_arrays, read_file
from ferry.engine.snapshot import HostBuffer, byte_view, snapshot
from ferry.errors import CorruptCheckpointError, FerryError, StorageError
from ferry.storage import Transaction, open_storage
from ferry.storage.hashed import hash_file

log = logging.getLogger("ferry")


class Collectives(Protocol):
    """What a multi-rank save needs of the job's ranks (``ferry.runtime.distributed.RankGroup``
    is one). Every call is a collective: all ranks make it, in the same order."""

    rank: int
    world_size: int

    def broadcast(self, value: Any) -> Any:
        """Rank 0's small, JSON-like ``value``, on every rank."""
        ...

    def gather(self, value: Any) -> list[Any] | None:
        """Every rank's small, JSON-like ``value`` on rank 0, by rank; None on the others."""
        ...


def rank_files_prefix(rank: int) -> str:
    """Where rank ``rank``'s extra files (a ``FunctionCheckpoint``'s) sit in a checkpoint."""
    return "" if rank == 0 else f"rank-{rank}/"


def _failure(rank: int, exc: BaseException) -> str:
    """A rank's failure, for every rank's message: ferry's own say what to do already."""
    if isinstance(exc, FerryError):
        return f"rank {rank}: {exc}"
    return f"rank {rank}: {type(exc).__name__}: {exc}"


def _write_part(txn: Transaction, rank: int, state: Any) -> tuple[Flattened, int]:
    flat = flatten(state)
    host, size = snapshot(flat, HostBuffer())
    data = "data-0.bin" if rank == 0 else f"rank-{rank}.bin"
    for entry in flat.entries:
        entry.file = data
    txn.add_file(data, byte_view(host))
    if rank:
        doc = json.dumps({"tree": flat.tree, "tensors": [e.to_json() for e in flat.entries]}).encode()
        txn.add_file(f"rank-{rank}.json", doc)
    return flat, size


def _write_sharded(txn: Transaction, rank: int, shards: dict[str, Any]) -> int:
    """DCP writes the sharded models (durably: its writer fsyncs); each rank then records
    the files it wrote, with their checksums. Returns the bytes written. Which optimizers
    were saved is in the training-state tree already (``sharded.optimizers_saved``)."""
    folder = txn.local_path(sharded.DCP_DIR)
    if folder is None:
        raise StorageError(
            f"sharded (FSDP) state needs a local or shared-filesystem checkpoint directory, "
            f"not {txn.storage.url}: stage it locally and transfer it"
        )
    sharded.save(shards, folder)
    size = 0
    for name in sharded.written_by(folder, rank):
        rel = f"{sharded.DCP_DIR}/{name}"
        size += txn.add_written(rel, *hash_file(txn.storage, txn.path(rel))).size
    return size


def save_ranked(
    url: str,
    group: Collectives,
    state: Any,
    *,
    step: int,
    meta: dict[str, Any] | None,
    keep_last: int | None,
    keep_every: int | None,
    shards: dict[str, Any] | None = None,
    extra_files: dict[str, bytes] | None = None,
) -> CheckpointInfo:
    """Every rank calls this with its own ``state`` (rank 0's includes the shared part), and
    the same sharded models in ``shards`` (saved collectively through DCP), and its own
    ``extra_files`` (under ``rank_files_prefix(rank)``).

    Rank 0 begins the transaction and broadcasts its names; every rank joins it and writes
    its own files; rank 0 gathers their records, commits (or aborts, when any rank failed)
    and broadcasts the outcome, so that every rank returns or raises alike."""
    t0 = time.perf_counter()
    storage = open_storage(url)
    txn: Transaction | None = None
    plan: dict[str, Any] = {}
    if group.rank == 0:
        try:
            txn = Transaction.begin(storage, next_name(storage.listdir(), step))
            plan = {"final": txn.final, "staging": txn.staging}
        except Exception as exc:  # any: the other ranks wait for this broadcast
            plan = {"error": _failure(0, exc)}
    plan = group.broadcast(plan)
    if "error" in plan:
        raise StorageError(plan["error"])
    if txn is None:
        txn = Transaction.join(storage, plan["final"], plan["staging"])
    try:
        outcome = _save_part(txn, group, state, step, meta, shards, extra_files or {})
    except BaseException:
        txn.abort()  # rank 0's; a joined rank leaves the folder to it
        raise
    if "url" in outcome and keep_last and group.rank == 0:
        try:
            apply_retention(storage, keep_last, keep_every)
        except Exception as exc:  # committed; old checkpoints stay, the next save retries
            outcome = {**outcome, "retention": _failure(0, exc)}
    outcome = group.broadcast(outcome)
    if "error" in outcome:
        raise StorageError(f"the checkpoint of step {step} was not committed: {outcome['error']}")
    if "retention" in outcome and group.rank == 0:
        log.warning("ferry: older checkpoints were not removed: %s", outcome["retention"])
    seconds = time.perf_counter() - t0
    return CheckpointInfo(outcome["url"], step, int(outcome["bytes"]), seconds, seconds)


def _save_part(
    txn: Transaction,
    group: Collectives,
    state: Any,
    step: int,
    meta: dict[str, Any] | None,
    shards: dict[str, Any] | None,
    extra_files: dict[str, bytes],
) -> dict[str, Any]:
    """This rank's files; on rank 0 also the commit. Returns rank 0's outcome ({} elsewhere)."""
    flat: Flattened | None = None
    mine: dict[str, Any]
    try:
        dcp_size = 0
        if shards:
            dcp_size = _write_sharded(txn, group.rank, shards)
        flat, size = _write_part(txn, group.rank, state)
        prefix = rank_files_prefix(group.rank)
        for name, blob in extra_files.items():
            size += txn.add_file(prefix + name, memoryview(blob)).size
        mine = {"files": txn.files, "size": size + dcp_size}
    except Exception as exc:  # any: the other ranks wait for this gather
        mine = {"error": _failure(group.rank, exc)}
    everyone = group.gather(mine)
    if everyone is None:
        return {}
    try:
        with txn:
            errors = [part["error"] for part in everyone if "error" in part]
            if errors or flat is None:
                raise StorageError("; ".join(errors))
            for part in everyone[1:]:
                for rel, m in part["files"].items():
                    txn.add_written(rel, int(m["size"]), str(m["xxh3_64"]))
            body = build_manifest(flat, step, txn.files, meta, group.world_size)
            txn.commit(manifest_bytes(body))
    except Exception as exc:  # any: the other ranks wait for the outcome's broadcast
        return {"error": str(exc) if isinstance(exc, FerryError) else _failure(0, exc)}
    return {"url": txn.storage.child_url(txn.final), "bytes": sum(int(p["size"]) for p in everyone)}


def rank_part(loaded: Loaded, rank: int) -> Any:
    """Rank ``rank``'s own part of a multi-rank checkpoint (rank 0's is in the main tree)."""
    storage, name = split_url(loaded.url)
    if name is None:
        raise CorruptCheckpointError(f"{loaded.url} is not a checkpoint folder of its root")
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
    part = parse_part(doc, {data_file: files[data_file]}, f"{loaded.url}/{key}")
    arrays = read_arrays(storage, name, {data_file: files[data_file]}, part["tensors"], torch.device("cpu"))
    return unflatten(part["tree"], arrays)
