"""Multi-rank agreement: every rank checkpoints at the same step, whichever rank was asked.

All calls here are collectives made from the training thread at a safe point (never from
a background thread). They run on a gloo group of their own, so they work beside NCCL.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

from ferry.errors import JobError

log = logging.getLogger("ferry")

STOP, CHECKPOINT = 0, 1


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

    def agree(self, stop: bool, checkpoint: bool) -> tuple[bool, bool]:
        """The union of every rank's wishes, identical on all ranks. JobError when another
        rank left the job meanwhile (it failed: its own output names the cause)."""
        flags = torch.tensor([int(stop), int(checkpoint)], dtype=torch.int64)
        try:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        except (RuntimeError, ValueError) as exc:  # torch's DistBackendError is a RuntimeError
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise JobError(
                f"rank {self.rank}: another rank of the job failed or left (its own output names "
                f"the cause), so the ranks cannot agree on a checkpoint: {first}"
            ) from exc
        return bool(flags[STOP]), bool(flags[CHECKPOINT])

    def broadcast(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather(self, value: Any) -> list[Any] | None:
        """Rank 0 gets every rank's small, JSON-like ``value``; others get None."""
        out: list[Any] = [None] * self.world_size if self.rank == 0 else []
        dist.gather_object(value, out if self.rank == 0 else None, dst=0, group=self.group)
        return out if self.rank == 0 else None

    def barrier(self) -> None:
        dist.barrier(group=self.group)


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


def replicated(objects: dict[str, Any]) -> bool:
    """Is the tracked state the same on every rank (every model wrapped in DDP)? Then rank 0
    writes it once. Anything else (FSDP, independent models) is written by each rank."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    modules = [m for m in objects.values() if isinstance(m, nn.Module)]
    return bool(modules) and all(isinstance(m, DistributedDataParallel) for m in modules)
