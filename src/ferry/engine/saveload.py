"""``save`` and ``load``: the engine's synchronous front door (ferry.engine re-exports them)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import torch

from ferry.engine.apply import apply_state
from ferry.engine.catalog import apply_retention, list_checkpoints, split_url
from ferry.engine.codec import flatten
from ferry.engine.gcpause import paused_gc
from ferry.engine.persist import CheckpointInfo, persist
from ferry.engine.reader import Loaded, load_one
from ferry.engine.snapshot import HostBuffer, byte_view, direct_segments, snapshot
from ferry.errors import CorruptCheckpointError, NoCheckpointError

log = logging.getLogger("ferry")


def save(
    state: Any,
    url: str,
    *,
    step: int,
    meta: dict[str, Any] | None = None,
    keep_last: int | None = None,
    keep_every: int | None = None,
    extra_files: dict[str, bytes] | None = None,
) -> CheckpointInfo:
    """Save ``state`` under the checkpoint root ``url`` synchronously; returns once committed."""
    from ferry.storage import open_storage

    t0 = time.perf_counter()
    with paused_gc():
        flat = flatten(state)
        # Nothing runs while a synchronous save writes: host tensors go out without a copy.
        direct = direct_segments(flat)
        if direct is None:
            host, size, _ = snapshot(flat, HostBuffer())
            data: memoryview | Iterator[memoryview] = byte_view(host)
        else:
            data, size = direct
        storage = open_storage(url)
        name = persist(storage, flat, data, step, meta=meta, extra_files=extra_files)
    if keep_last:  # the retired checkpoints' bytes go in the background (storage.sweep)
        apply_retention(storage, keep_last, keep_every, later=True)
    seconds = time.perf_counter() - t0
    return CheckpointInfo(storage.child_url(name), step, size, seconds, seconds)


def load(
    url: str, *, into: Any = None, target_device: str | torch.device = "cpu", fallback: bool = True
) -> Loaded:
    """Load the checkpoint at ``url`` (a checkpoint, or a root: the newest good one in it).

    With ``into`` (the tree that was saved, holding live objects), the state is restored
    into it in place. A damaged checkpoint under a root is skipped for the newest good one,
    with a warning saying which and why; ``fallback=False`` raises instead.
    """
    storage, name = split_url(url)
    if name is not None:
        candidates = [name]
    else:
        candidates = [r.name for r in reversed(list_checkpoints(storage))]
        if not candidates:
            raise NoCheckpointError(
                f"no committed checkpoint under {url}; check the URL, or start the job fresh"
            )
    errors = []
    for cand in candidates:
        try:
            with paused_gc():
                loaded = load_one(storage, cand, target_device, into=into)
            if into is not None:  # a state that does not fit the live objects: the next one
                apply_state(into, loaded.state)
        except CorruptCheckpointError as exc:
            if not fallback or name is not None:
                raise
            errors.append(str(exc))
            log.warning("ferry: skipping damaged checkpoint: %s", exc)
            continue
        if errors:
            log.warning(
                "ferry: fell back to %s (step %d) after %d damaged checkpoint(s)",
                loaded.url,
                loaded.step,
                len(errors),
            )
        return loaded
    raise CorruptCheckpointError(f"every checkpoint under {url} is damaged: {errors[0]}")
