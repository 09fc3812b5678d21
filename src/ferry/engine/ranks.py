"""Checkpoints of multi-rank jobs: the shared state once, each rank's own part beside it.

Folder of a checkpoint saved by W ranks::

    data-0.bin, manifest.json   rank 0: the replicated state (a DDP model, its optimizer)
                                and rank 0's own part
    rank-R.bin, rank-R.json     rank R >= 1: its own part (RNG streams, data position,
                                gradients, and its whole state when nothing is replicated)
    user/..., rank-R/user/...   the files of a ``FunctionCheckpoint`` on rank 0, on rank R
    dcp/...                     sharded (FSDP2) models, through torch.distributed.checkpoint

Every rank writes its files into the staging folder of one commit transaction
(``ferry.storage.transaction``) that rank 0 began; rank 0 records their checksums, writes
the manifest that lists every file, and commits. A checkpoint is thus complete or
invisible. How the ranks do so in the background, and agree on the outcome, is
``ferry.engine.ranksave``; this module writes and reads one rank's part.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from ferry.engine import sharded
from ferry.engine.catalog import split_url
from ferry.engine.codec import Flattened, unflatten
from ferry.engine.reader import Loaded, read_arrays, read_file
from ferry.engine.snapshot import byte_view
from ferry.errors import CorruptCheckpointError, FerryError, StorageError
from ferry.format.manifest import parse_part
from ferry.storage import Transaction
from ferry.storage.hashed import hash_file


def failure(rank: int, exc: BaseException) -> str:
    """A rank's failure, for every rank's message: ferry's own say what to do already."""
    if isinstance(exc, FerryError):
        return f"rank {rank}: {exc}"
    return f"rank {rank}: {type(exc).__name__}: {exc}"


def rank_files_prefix(rank: int) -> str:
    """Where rank ``rank``'s extra files (a ``FunctionCheckpoint``'s) sit in a checkpoint."""
    return "" if rank == 0 else f"rank-{rank}/"


def write_part(txn: Transaction, rank: int, flat: Flattened, host: torch.Tensor) -> int:
    """Write this rank's snapshot (``RankSaver.save``) into the checkpoint; returns its bytes.
    Rank 0's tensors are listed in the manifest, another rank's in its ``rank-R.json``."""
    data = "data-0.bin" if rank == 0 else f"rank-{rank}.bin"
    for entry in flat.entries:
        entry.file = data
    size = txn.add_file(data, byte_view(host)).size
    if rank:
        doc = json.dumps({"tree": flat.tree, "tensors": [e.to_json() for e in flat.entries]}).encode()
        txn.add_file(f"rank-{rank}.json", doc)
    return size


def write_sharded(txn: Transaction, rank: int, staged: dict[str, Any], group: Any) -> int:
    """DCP writes the staged sharded state (``sharded.stage``; durably: its writer fsyncs),
    a collective over ``group``; this rank then records the files it wrote, with their
    checksums. Returns the bytes written. Which optimizers were saved is in the
    training-state tree already (``sharded.optimizers_saved``)."""
    folder = txn.local_path(sharded.DCP_DIR)
    if folder is None:
        raise StorageError(
            f"sharded (FSDP) state needs a local or shared-filesystem checkpoint directory, "
            f"not {txn.storage.url}: stage it locally and transfer it"
        )
    sharded.write(staged, folder, group)
    size = 0
    for name in sharded.written_by(folder, rank):
        rel = f"{sharded.DCP_DIR}/{name}"
        size += txn.add_written(rel, *hash_file(txn.storage, txn.path(rel))).size
    return size


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
