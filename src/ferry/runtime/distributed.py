"""Multi-rank agreement: every rank checkpoints at the same step, whichever rank was asked.

All calls here are collectives made from the training thread at a safe point (never from
a background thread). They run on a gloo group of their own, so they work beside NCCL.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

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
        """The union of every rank's wishes, identical on all ranks."""
        flags = torch.tensor([int(stop), int(checkpoint)], dtype=torch.int64)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
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


def replicated(objects: dict[str, Any]) -> bool:
    """Is the tracked state the same on every rank (every model wrapped in DDP)? Then rank 0
    writes it once. Anything else (FSDP, independent models) is written by each rank."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    modules = [m for m in objects.values() if isinstance(m, nn.Module)]
    return bool(modules) and all(isinstance(m, DistributedDataParallel) for m in modules)
