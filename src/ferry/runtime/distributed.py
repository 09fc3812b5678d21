"""Multi-rank agreement: every rank checkpoints at the same step, whichever rank was asked;
and the channel the ranks' background saves talk through.

``RankGroup.agree`` is a collective made from the training thread at a safe point (never
from a background thread), on a gloo group of its own, so it works beside NCCL. The
background saves use ``StoreBoard``: keys on the job's TCPStore, through a connection of
their own (a blocking wait there never holds the training thread's store calls), no
collectives.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore

from ferry.errors import JobError, StorageError

log = logging.getLogger("ferry")

PROBE_PREFIX = ".ferry-probe-"
"""A file rank 0 writes into the checkpoint root for an instant (``RankGroup.blind_to``):
outside the checkpoint names, ignored by the catalog."""
UNKNOWN_NS = 1 << 62
"""A cost or step time not measured yet, as sent in a vote: larger than any measurement, so
that an agreed cost is unknown until every rank measured one, and an agreed step time is
known as soon as any rank measured one."""


@dataclass(frozen=True)
class Vote:
    """What one rank brings to an agreement, and what the agreement returns."""

    stop: bool = False
    save: bool = False
    cost_ns: int = UNKNOWN_NS
    """This rank's cost of one agreement; agreed: the largest over the ranks."""
    step_ns: int = UNKNOWN_NS
    """This rank's time of one step; agreed: the least over the ranks."""
    token: int = 0
    """Agreed: rank 0's random number, which names the save this agreement may start."""


class RankGroup:
    """The job's ranks, as seen from one of them."""

    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._group: Any = None

    @staticmethod
    def detect() -> RankGroup | None:
        if dist.is_available() and dist.is_initialized():  # one rank too: DCP needs the group
            return RankGroup()
        return None

    @property
    def group(self) -> Any:
        if self._group is None:  # collective: every rank gets here at the same safe point
            self._group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD
        return self._group

    def agree(self, vote: Vote) -> Vote:
        """Every rank's wishes united, the largest cost, the least step time, rank 0's token:
        the same on all ranks. JobError when another rank left the job meanwhile (it failed: its own
        output names the cause)."""
        token = secrets.randbits(62) if self.rank == 0 else 0
        values = [int(vote.stop), int(vote.save), vote.cost_ns, -vote.step_ns, token]
        flags = torch.tensor(values, dtype=torch.int64)
        try:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        except (RuntimeError, ValueError) as exc:  # torch's DistBackendError is a RuntimeError
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise JobError(
                f"rank {self.rank}: another rank of the job failed or left (its own output names "
                f"the cause), so the ranks cannot agree on a checkpoint: {first}"
            ) from exc
        stop, save, cost, step, token = (int(v) for v in flags.tolist())
        return Vote(bool(stop), bool(save), cost, -step, token)

    def background_group(self) -> Any:
        """A gloo group that only background saves use (torch.distributed.checkpoint's
        collectives), so that they never interleave with the training thread's. Collective:
        every rank makes its first call at the same save."""
        return dist.new_group(backend="gloo")

    def board(self) -> StoreBoard:
        """The job's store, through a connection of this rank's own where it is a TCPStore."""
        return StoreBoard(self.store(60.0))

    def store(self, timeout: float) -> Any:
        """The job's store, through a new connection of this rank's own (whose calls give up
        after ``timeout`` seconds) where it is a TCPStore; the store itself otherwise."""
        store: Any = dist.distributed_c10d._get_default_store()
        while isinstance(store, PrefixStore):
            store = store.underlying_store
        if isinstance(store, TCPStore):
            store = TCPStore(
                store.host,
                store.port,
                is_master=False,
                wait_for_workers=False,
                timeout=timedelta(seconds=timeout),
            )
        return store

    def blind_to(self, root: str) -> list[tuple[int, str]]:
        """The ranks that cannot see what rank 0 writes into the checkpoint root ``root`` (a
        path or a file:// URL; any other URL names one store every rank reaches): a root on
        each node's own disk. Collective, made once, at the ranks' first agreement: rank 0
        writes a file named by a random number, every rank looks for it. Each blind rank comes
        with its node (``node_name``)."""
        path = root[len("file://") :] if root.startswith("file://") else root
        if "://" in path:
            return []
        token = 0
        if self.rank == 0:
            token = secrets.randbits(62)
            try:
                os.makedirs(path, exist_ok=True)
                with open(os.path.join(path, f"{PROBE_PREFIX}{token:016x}"), "x"):
                    pass
            except OSError:  # a root rank 0 cannot write: its saves say so
                token = 0
        shared = torch.tensor([token], dtype=torch.int64)
        dist.all_reduce(shared, op=dist.ReduceOp.MAX, group=self.group)
        token = int(shared.item())
        if not token:
            return []
        probe = os.path.join(path, f"{PROBE_PREFIX}{token:016x}")
        blind = torch.zeros(self.world_size, dtype=torch.int64)
        node = node_name()  # sent as node + 2 (1: a node without a number; 0: not blind)
        blind[self.rank] = 0 if os.path.exists(probe) else int(node) + 2 if node.isdigit() else 1
        dist.all_reduce(blind, op=dist.ReduceOp.MAX, group=self.group)
        if self.rank == 0:
            with contextlib.suppress(OSError):
                os.unlink(probe)
        return [(r, str(b - 2) if b > 1 else "?") for r, b in enumerate(blind.tolist()) if b]


class StoreBoard:
    """Small values shared by the ranks' background saves through a ``torch.distributed``
    store (``ferry.engine.ranksave.Board``). Keys are set once and read by any rank; a wait
    blocks until every key named is set, then returns their values."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def post(self, key: str, value: bytes) -> None:
        self.store.set(key, value)

    def wait(self, keys: list[str], timeout: float) -> list[bytes]:
        t0 = time.monotonic()
        try:
            self.store.wait(keys, timedelta(seconds=timeout))
            values: list[bytes] = self.store.multi_get(keys)
        except (RuntimeError, ValueError) as exc:  # a timeout, or the store is gone
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StorageError(
                f"the other ranks did not answer in {time.monotonic() - t0:.0f} s ({why}); one of them "
                "failed or hangs (its own output names the cause)"
            ) from exc
        return values

    def remove(self, keys: list[str]) -> None:
        for key in keys:
            with contextlib.suppress(RuntimeError):
                self.store.delete_key(key)


class WaitBeforeTeardown:
    """``torch.distributed.destroy_process_group`` first calls ``wait`` (the save in flight):
    a background save writes sharded state through collectives on a group of its own, and
    scripts tear the groups down right after training, before ferry's session closes at
    exit, which would pull the group from under the last save. Hooked at that one function
    of ``torch.distributed`` (how scripts call it), put back by ``remove`` unless another
    hook was put on top since."""

    def __init__(self, wait: Callable[[], None]) -> None:
        self.original = dist.destroy_process_group

        def destroy_process_group(group: Any = None) -> None:
            with contextlib.suppress(Exception):  # its failure was reported; the teardown goes on
                wait()
            self.original(group)

        self.hook = destroy_process_group
        dist.destroy_process_group = destroy_process_group

    def remove(self) -> None:
        if dist.destroy_process_group is self.hook:
            dist.destroy_process_group = self.original


class AbortOnCrash:
    """An uncaught exception on one rank ends that rank's process at once, so that the other
    ranks fail in their next collective (their peer is gone) and a launcher such as torchrun
    sees the failure, instead of waiting for this rank until the process group's timeout (30
    minutes by default): the process of a crashed rank may otherwise live on for long (a
    non-daemon thread it waits for at exit, a hung teardown). Tearing the group down
    (``destroy_process_group``) is not enough: gloo keeps the peers' connections open.

    Installed as ``sys.excepthook`` in front of the one it finds, which runs first (the
    traceback is printed and the crash reported before the process ends). ``disarm`` leaves
    only the previous hook's work: another hook may have chained onto this one since."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.armed = True
        self.previous = sys.excepthook
        sys.excepthook = self

    def __call__(self, kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        self.previous(kind, value, tb)
        if not (self.armed and dist.is_available() and dist.is_initialized()):
            return
        log.error(
            "ferry: rank %d failed (%s: %s); ending this rank now, so that the other ranks stop "
            "instead of waiting for it",
            self.rank,
            kind.__name__,
            value,
        )
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(1)  # Python's own status for an uncaught exception

    def disarm(self) -> None:
        self.armed = False
        if sys.excepthook is self:
            sys.excepthook = self.previous


def end_rank(why: str, code: int) -> NoReturn:
    """End this rank at once, with ``why`` in its log and exit status ``code``: a rank that
    cannot go on with the job (the others then fail at their next collective, and the
    launcher sees the failure)."""
    log.error("ferry: error: %s", why)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def speaks_for_node(rank: int) -> bool:
    """Does this rank write its node's job directory (status, events, answers to requests)?
    The node's first rank (torchrun's ``LOCAL_RANK`` 0); rank 0 where no launcher says."""
    local = os.environ.get("LOCAL_RANK")
    return local == "0" if local is not None and local.isdigit() else rank == 0


def node_name() -> str:
    """This rank's node, as messages name it: torchrun's node index (``GROUP_RANK``), else '?'."""
    group = os.environ.get("GROUP_RANK", "")
    return group if group.isdigit() else "?"


def replicated(objects: dict[str, Any]) -> bool:
    """Is the tracked state the same on every rank (every model wrapped in DDP)? Then rank 0
    writes it once. Anything else (FSDP, independent models) is written by each rank."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    modules = [m for m in objects.values() if isinstance(m, nn.Module)]
    return bool(modules) and all(isinstance(m, DistributedDataParallel) for m in modules)
