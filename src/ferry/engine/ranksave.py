"""Asynchronous saves of a multi-rank job: each rank blocks only for its snapshot; the
writing, the checksums and the commit happen on one background thread per rank, which
talk through a ``Board`` (the job's TCPStore), never through collectives.

The ranks have agreed, at a safe point, to save step S, and share a name for this save
(``ferry.runtime.distributed.Vote.token``). Then, keys under that name::

    training thread, every rank   wait for its previous save's outcome (one save in flight
                                  per job); snapshot its part (and its sharded state) into
                                  host memory; hand it to the background thread; train on
    background, rank 0            list the root, begin the transaction, post  NAME/plan
    background, rank R            wait for NAME/plan, join the transaction
    background, every rank        torch.distributed.checkpoint writes the sharded state, if
                                  any (its collectives on a gloo group of background saves
                                  only); write its part, durably; post  NAME/part/R  (its
                                  files and checksums, or its error)
    background, rank 0            wait for every NAME/part/R; record them, write the
                                  manifest, commit, apply retention (or abort, if any rank
                                  failed); post  NAME/outcome
    background, rank R            wait for NAME/outcome; report the commit or the failure

So a checkpoint is listed only once every rank's part is durable; a rank that fails posts
its error at once and reports it, rank 0 aborts (the staging folder goes) and every rank
reports the failure, and the next save starts afresh. A rank killed mid-save leaves its
part unposted: rank 0 commits nothing, and the ranks' next agreement fails on the dead
peer. Rank 0 removes each save's keys once no rank can read them any more.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ferry.engine.asyncsave import InflightSaves, SaveHandle, Stall, _frozen
from ferry.engine.catalog import apply_retention
from ferry.engine.codec import Flattened, flatten
from ferry.engine.deferred import Deferred
from ferry.engine.persist import CheckpointInfo, build_manifest, check_step, next_name
from ferry.engine.ranks import failure, rank_files_prefix, write_part, write_sharded
from ferry.errors import FerryError, StorageError
from ferry.format.wire import manifest_bytes
from ferry.knobs import RANK_SAVE_TIMEOUT_SECONDS
from ferry.progress import Tally, counting
from ferry.storage import Storage, Transaction, open_storage

log = logging.getLogger("ferry")


class Board(Protocol):
    """Small values the ranks' background saves share (``ferry.runtime.distributed.StoreBoard``
    over the job's TCPStore). Calls come from background threads; none is a collective."""

    def post(self, key: str, value: bytes) -> None:
        """Set ``key``, for any rank to read."""
        ...

    def wait(self, keys: list[str], timeout: float) -> list[bytes]:
        """The values of ``keys``, once all are set; StorageError after ``timeout`` seconds."""
        ...

    def remove(self, keys: list[str]) -> None:
        """Forget ``keys`` (missing ones included)."""
        ...


@dataclass
class _Snapshot:
    """What a rank took at the safe point: everything the background thread needs."""

    name: str
    step: int
    flat: Flattened
    host: torch.Tensor
    size: int
    meta: dict[str, Any] | None
    extra_files: dict[str, bytes]
    shards: dict[str, Any] | None
    shard_group: Any
    t0: float
    """When the save's own time began (``RankSaver.save``'s ``since``)."""
    stall: Stall
    """What the save cost the training thread."""
    deferred: Deferred | None
    """The copies the snapshot left running (``overlap_snapshot``)."""


def _dump(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode()


def _load(raw: bytes) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(raw)
    return value


class RankSaver(InflightSaves):
    """One rank's side of the job's saves to one checkpoint root; reuses its host buffer."""

    def __init__(self, url: str, *, rank: int, world_size: int, board: Board,
                 keep_last: int | None = 3, keep_every: int | None = None,
                 on_commit: Callable[[CheckpointInfo], None] | None = None,
                 on_error: Callable[[int, Exception], None] | None = None,
                 timeout: float = RANK_SAVE_TIMEOUT_SECONDS,
                 tally: Tally | None = None) -> None:  # fmt: skip
        """``tally``: counts this rank's bytes of the save in flight, for the job's status
        (rank 0's: the job's status is rank 0's to write); the sharded state, which DCP
        writes, is in neither the count nor the total."""
        self.url = url
        self.tally = tally
        self.storage: Storage = open_storage(url)
        self.rank, self.world_size, self.board = rank, world_size, board
        self.keep_last, self.keep_every = keep_last, keep_every
        self.on_commit, self.on_error = on_commit, on_error
        self.timeout = timeout
        super().__init__("ferry-rank-save")
        self._spent: list[str] = []  # rank 0: keys of the previous save, removed at the next

    def save(self, state: Any, *, name: str, step: int, meta: dict[str, Any] | None = None,
             extra_files: dict[str, bytes] | None = None, shards: dict[str, Any] | None = None,
             shard_group: Any = None, blocking: bool = False,
             defer: Mapping[int, object] | None = None,
             since: float | None = None) -> SaveHandle:  # fmt: skip
        """Every rank calls this at the same step with the same ``name`` (new for each save),
        its own ``state`` and ``extra_files``, and the sharded state staged by
        ``sharded.stage`` in ``shards`` (with the group its collectives run on). Waits for
        the previous save's outcome, snapshots, and returns; ``blocking=True`` waits for the
        commit and raises the save's error. ``defer`` and ``since``: as ``AsyncSaver.save``'s."""
        check_step(step)
        meta, extra = _frozen(meta), {k: bytes(v) for k, v in (extra_files or {}).items()}
        t0 = time.perf_counter() if since is None else since
        before = time.perf_counter()
        self.wait()  # one save in flight; the snapshot buffer is free after it
        start = t0 + time.perf_counter() - before  # the previous save's time is not this one's
        flat = flatten(state)
        host, size, deferred = self.deferred_snapshot(flat, None if blocking else defer)
        snap = _Snapshot(name, step, flat, host, size, meta, extra, shards, shard_group, start,
                         Stall(t0, blocking), deferred)  # fmt: skip
        reported = threading.Event()
        report = None if blocking else self.on_error

        def fail(exc: Exception) -> None:
            if report is not None and not reported.is_set():
                report(step, exc)
                reported.set()

        def work() -> CheckpointInfo:
            total = snap.size + sum(len(blob) for blob in snap.extra_files.values())
            try:
                with counting(self.tally, step, total):  # until every rank's part is committed
                    info = self._persist(snap, fail)
            except Exception as exc:
                fail(exc)
                raise
            if self.on_commit is not None:
                self.on_commit(info)
            return info

        handle = self._start(work, step, reported)
        snap.stall.returned()
        if blocking:
            self._settle(handle)
        return handle

    # ------------------------------------------------------------------ background
    def _persist(self, snap: _Snapshot, fail: Callable[[Exception], None]) -> CheckpointInfo:
        """This rank's side of one save (the module's docstring); returns the commit, raises
        StorageError when the save failed on any rank. ``fail`` reports this rank's own
        failure at once."""
        txn = self._plan(snap)
        part = self._write(txn, snap)
        if "error" in part:
            fail(StorageError(f"the checkpoint of step {snap.step} was not committed: {part['error']}"))
        self.board.post(f"{snap.name}/part/{self.rank}", _dump(part))
        if self.rank == 0:
            outcome = self._conclude(txn, snap)
            self.board.post(f"{snap.name}/outcome", _dump(outcome))
            # Every rank read the previous save's outcome before it posted a part of this one.
            parts = [f"{snap.name}/part/{r}" for r in range(self.world_size)]
            self.board.remove([*parts, *self._spent])
            self._spent = [f"{snap.name}/plan", f"{snap.name}/outcome"]
        else:
            (raw,) = self.board.wait([f"{snap.name}/outcome"], self.timeout)
            outcome = _load(raw)
        if "error" in outcome:
            raise StorageError(f"the checkpoint of step {snap.step} was not committed: {outcome['error']}")
        seconds = time.perf_counter() - snap.t0
        blocked = snap.stall.seconds(snap.deferred)
        return CheckpointInfo(str(outcome["url"]), snap.step, int(outcome["bytes"]), seconds, blocked)

    def _plan(self, snap: _Snapshot) -> Transaction:
        """Rank 0 begins the transaction and posts its names; the others join it."""
        key = f"{snap.name}/plan"
        if self.rank == 0:
            try:
                txn = Transaction.begin(self.storage, next_name(self.storage.listdir(), snap.step))
            except Exception as exc:  # any: the other ranks wait for this plan
                self.board.post(key, _dump({"error": failure(0, exc)}))
                self._spent.append(key)
                raise StorageError(
                    f"the checkpoint of step {snap.step} was not begun: {failure(0, exc)}"
                ) from exc
            self.board.post(key, _dump({"final": txn.final, "staging": txn.staging}))
            return txn
        (raw,) = self.board.wait([key], self.timeout)
        plan = _load(raw)
        if "error" in plan:
            raise StorageError(f"the checkpoint of step {snap.step} was not begun: {plan['error']}")
        return Transaction.join(self.storage, str(plan["final"]), str(plan["staging"]))

    def _write(self, txn: Transaction, snap: _Snapshot) -> dict[str, Any]:
        """This rank's files, durably: ``{"files", "size"}``, or ``{"error"}``."""
        try:
            size = 0
            if snap.shards:  # first: its collectives must not wait for a rank's own failure
                size += write_sharded(txn, self.rank, snap.shards, snap.shard_group)
            if snap.deferred is not None:
                snap.deferred.check()
            size += write_part(txn, self.rank, snap.flat, snap.host)
            prefix = rank_files_prefix(self.rank)
            for rel, blob in snap.extra_files.items():
                size += txn.add_file(prefix + rel, memoryview(blob)).size
        except Exception as exc:  # any: rank 0 waits for this rank's part
            return {"error": failure(self.rank, exc)}
        return {"files": txn.files, "size": size}

    def _conclude(self, txn: Transaction, snap: _Snapshot) -> dict[str, Any]:
        """Rank 0: once every part is in, commit or abort; the outcome every rank reports."""
        keys = [f"{snap.name}/part/{r}" for r in range(self.world_size)]
        try:
            parts = [_load(raw) for raw in self.board.wait(keys, self.timeout)]
        except Exception as exc:  # a rank that hangs: nothing is committed
            txn.abort()
            return {"error": str(exc) if isinstance(exc, FerryError) else failure(0, exc)}
        try:
            with txn:
                errors = [str(part["error"]) for part in parts if "error" in part]
                if errors:
                    raise StorageError("; ".join(errors))
                for part in parts[1:]:
                    for rel, m in part["files"].items():
                        txn.add_written(rel, int(m["size"]), str(m["xxh3_64"]))
                body = build_manifest(snap.flat, snap.step, txn.files, snap.meta, self.world_size)
                txn.commit(manifest_bytes(body))
        except Exception as exc:  # any: every rank waits for the outcome
            return {"error": str(exc) if isinstance(exc, FerryError) else failure(0, exc)}
        outcome: dict[str, Any] = {
            "url": self.storage.child_url(txn.final),
            "bytes": sum(int(p["size"]) for p in parts),
        }
        if self.keep_last:
            try:
                apply_retention(self.storage, self.keep_last, self.keep_every)
            except Exception as exc:  # committed; old checkpoints stay, the next save retries
                log.warning("ferry: older checkpoints were not removed: %s", exc)
        return outcome
