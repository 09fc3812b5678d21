"""Whether a migration may start its target worker beside the running one (warm), or must
restart it (cold): a pure function of what ``ferry migrate`` found out about the job and
the machine. Each reason is the one line ``ferry migrate`` prints before it goes cold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

MEMORY_MARGIN = 1.1
"""The second worker's host memory is estimated from the first's; this much more is asked for."""


@dataclass(frozen=True, kw_only=True)
class WarmFacts:
    """What the preflight knows about the job and the machine."""

    launcher: str | None = None
    """The job's command is a multi-process launcher (torchrun): its ranks rendezvous on a
    port and a store of their own, which a second set of ranks would join or fight over."""
    world_size: int = 1
    """WORLD_SIZE in the worker's environment (a rank of a job started some other way)."""
    mem_available: int | None = None
    """Host memory available now (MemAvailable), in bytes; None: unknown (no /proc/meminfo)."""
    worker_rss: int = 0
    """Resident memory of the running worker and its children: what a second copy needs."""
    state_bytes: int = 0
    """The job's newest checkpoint: the hand-over's copy in host memory (/dev/shm)."""
    gpu_needed: int = 0
    """Device memory the running worker holds on its busiest GPU (0: none, or unknown)."""
    gpu_free: Mapping[str, int] = field(default_factory=dict)
    """Free memory of each target GPU (by its CUDA_VISIBLE_DEVICES entry), where NVML told."""


def size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n < 2**30 else f"{n / 2**30:.1f} GiB"


def cold_reason(f: WarmFacts) -> str | None:
    """None when the warm path may run; otherwise why the migration restarts cold instead."""
    if f.launcher is not None:
        return f"the job runs under {f.launcher}: its ranks cannot run twice at once (multi-rank jobs)"
    if f.world_size > 1:
        return f"the job is one of {f.world_size} ranks: ranks cannot run twice at once (multi-rank jobs)"
    if f.mem_available is not None:
        needed = int((f.worker_rss + f.state_bytes) * MEMORY_MARGIN)
        if needed > f.mem_available:
            return (
                f"a second copy of the job needs about {size(needed)} of host memory during the "
                f"overlap, and {size(f.mem_available)} is available"
            )
    if f.gpu_needed:
        short = {d: free for d, free in f.gpu_free.items() if free < f.gpu_needed * MEMORY_MARGIN}
        if short:
            device, free = sorted(short.items())[0]
            return (
                f"GPU {device} has {size(free)} free, and the job holds {size(f.gpu_needed)} on its "
                "GPU: the target worker could not set up there while the old one runs"
            )
    return None
