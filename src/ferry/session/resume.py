"""Resuming: find the checkpoint (handed over in memory, or the newest good one in storage),
take this rank's view of it, and put it back into the live objects when the time comes."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from ferry.engine import Loaded, load
from ferry.engine.ranks import rank_part
from ferry.errors import ConfigError, NoCheckpointError
from ferry.session.checkpointer import Checkpointer
from ferry.state.loader import LoaderTracker
from ferry.state.training import TrainingState

log = logging.getLogger("ferry")


def find(checkpoint_dir: str, checkpointer: Checkpointer) -> Resume | None:
    """The checkpoint to resume from, or None to start fresh."""
    t0 = time.perf_counter()
    handed = checkpointer.take_handed_over()
    try:
        loaded = handed or load(checkpoint_dir)
    except NoCheckpointError:
        return None
    if handed is not None:
        log.info("ferry: the state of step %d was handed over in host memory", handed.step)
    state = rank_view(loaded, checkpointer.rank, checkpointer.world_size)
    return Resume(loaded, state, time.perf_counter() - t0)


def rank_view(loaded: Loaded, rank: int, world: int) -> TrainingState:
    """Rank ``rank``'s state from a checkpoint, checking that ``world`` ranks may resume it."""
    saved = int(loaded.manifest.get("world_size", 1))
    if world > saved:
        raise ConfigError(
            f"{loaded.url} was saved by {saved} rank(s); resuming on {world} ranks would invent "
            f"the missing ranks' random streams and data positions: resume with at most {saved}"
        )
    state = TrainingState.parse(loaded.state, loaded.url)
    if rank > 0:
        part = TrainingState.parse(rank_part(loaded, rank), f"{loaded.url}/rank-{rank}.json", part=True)
        state = state.with_part(part)
    if world == saved:
        return state
    loaders = {}
    for name, pos in state.loaders.items():
        if pos["batches"] not in (0, pos.get("length")):
            raise ConfigError(
                f"{loaded.url} (step {loaded.step}) was taken mid-epoch by {saved} ranks, and "
                f"{name}'s DistributedSampler shards change with the number of ranks: resume "
                f"it on {saved} ranks, or from a checkpoint taken at an epoch boundary"
            )
        loaders[name] = {**pos, "complete": pos["batches"] == pos.get("length") and pos["batches"] > 0}
    return replace(state, loaders=loaders)


class Resume:
    """The checkpoint this process resumes from, and how far its restore has got: restored
    at once (``ferry.restore()``, or nothing to wait for), or at the driving loader's first
    batch (``pending``), where the RNG streams are those the loop starts with."""

    def __init__(self, loaded: Loaded, state: TrainingState, load_seconds: float) -> None:
        self.loaded, self.state, self.load_seconds = loaded, state, load_seconds
        self.pending = False
        self.done = False
        self.in_place = False
        """Zero-code mode: the driving loader continued the saved epoch at its first iter()
        and the loop's frames were put back, so other loaders go on from where they were."""

    @property
    def step(self) -> int:
        return self.loaded.step

    def resume_loader(self, tracker: LoaderTracker, *, relative: bool, driver: bool) -> None:
        """Tell a loader where it was. ``relative``: at its next iter(), not at the saved epoch."""
        position = self.state.loaders.get(tracker.name)
        if position is None:
            return
        tracker.resume_at = position
        tracker.relative = relative
        tracker.restore_pending = not relative and driver

    def apply(self, objects: dict[str, Any], loaders: Mapping[str, LoaderTracker], t0: float) -> float:
        """Restore everything now; returns the restore's seconds (load included) since ``t0``."""
        self.state.restore(objects, loaders, self.loaded.url)
        self.done, self.pending = True, False
        return self.load_seconds + time.perf_counter() - t0

    def catch_up(self, objects: dict[str, Any], loaders: Iterable[LoaderTracker]) -> None:
        """Objects and loaders tracked after the restore get their state now."""
        self.state.restore_objects(objects)
        for tracker in loaders:
            if self.in_place:
                self.after_in_place(tracker)
            else:
                self.resume_loader(tracker, relative=True, driver=False)

    def after_in_place(self, tracker: LoaderTracker) -> None:
        """A loader other than the driving one, after an in-place restore: the script's loop
        is where it was at the save, so a loader whose epoch had ended starts its next one
        fresh at its next iter(), and one stopped inside an epoch continues it there."""
        position = self.state.loaders.get(tracker.name)
        if position is None:
            return
        if position["batches"] and position["batches"] == position.get("length"):
            tracker.epoch, tracker.batches = int(position["epoch"]), int(position["batches"])
            tracker.resume_at, tracker.relative, tracker.restore_pending = None, False, False
        else:
            self.resume_loader(tracker, relative=True, driver=False)
