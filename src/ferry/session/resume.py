"""Resuming: find the checkpoint (handed over in memory, or the newest good one in storage),
take this rank's view of it, and put it back into the live objects when the time comes."""

from __future__ import annotations

import logging
import os
import shlex
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from torch.utils.data import IterableDataset

from ferry.engine import Loaded, load
from ferry.engine.ranks import rank_part
from ferry.errors import ConfigError, NoCheckpointError
from ferry.runtime.samejob import checkpointed_job
from ferry.session.checkpointer import Checkpointer
from ferry.state import inputs, loader_identity
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


def starting_fresh(checkpoint_dir: str, job_id: str, argv: list[str]) -> None:
    """Say that a run starts from scratch, and where this command's checkpoints are when
    another job of it has some."""
    log.info("ferry: no checkpoint under %s: starting fresh", checkpoint_dir)
    other = checkpointed_job(argv, os.getcwd(), not_dir=checkpoint_dir, not_id=job_id)
    if other is not None:
        log.warning(
            "ferry: job %s ran this same command and checkpointed step %d under %s: to resume "
            "it instead, run with --dir %s",
            other.id,
            other.step,
            other.checkpoint_dir,
            shlex.quote(other.checkpoint_dir),
        )


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
    if rank == 0:  # allowed, but the job's shape changed: say so once
        log.warning(
            "ferry: warning: %s was saved by %d ranks and resumes on %d (taken at an epoch "
            "boundary, so each loader starts its next epoch on the new shards)",
            loaded.url,
            saved,
            world,
        )
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
        self.allow_changed_inputs = False
        """Resume loaders whose recorded inputs changed (with a warning) instead of refusing."""
        self.built_before_restore = 0
        """Loaders with a serial below this existed when the state was restored."""

    @property
    def step(self) -> int:
        return self.loaded.step

    def resume_loader(self, tracker: LoaderTracker, *, relative: bool, driver: bool) -> None:
        """Tell a loader where it was. ``relative``: at its next iter(), not at the saved epoch."""
        position = self.state.loaders.get(tracker.name)
        identity = tracker.identity
        finished = identity is not None and loader_identity.replays_finished_epoch(
            identity, self.state.driver
        )
        if identity is not None and not relative and (position is None or finished):
            # a training loader of an epoch the checkpoint covers, even if it was still
            # referenced (so saved) at the checkpoint: its epoch is over
            self._replay_finished_epoch(tracker, identity)
            return
        if position is None:
            return
        outcome = loader_identity.decide(
            zero_code=identity is not None,
            before_restore=not relative,
            driver=driver,
            built_after_restore=identity is not None and identity.serial >= self.built_before_restore,
            active=loader_identity.active(position),
        )
        if outcome is loader_identity.Outcome.FRESH:
            return
        if outcome is loader_identity.Outcome.CONTINUE:
            tracker.epoch = int(position["epoch"])
            tracker.restore_generators(position)
            tracker.pool_rng = position.get("pool_rng")
            return
        self.check_inputs(tracker, position)
        tracker.resume_at = position
        tracker.relative = relative
        tracker.restore_pending = not relative and driver

    def _replay_finished_epoch(self, tracker: LoaderTracker, identity: loader_identity.Identity) -> None:
        """A training loader built for an epoch the checkpoint covers: its one epoch is
        finished already, so it yields nothing (its indices are drawn, nothing is loaded)."""
        loader = tracker.loader_ref()
        if loader is None or isinstance(loader.dataset, IterableDataset):  # no sampler to skip at
            return
        if not loader_identity.replays_finished_epoch(identity, self.state.driver):
            return
        try:
            length = len(loader)
        except TypeError:
            return
        # epoch 1 of a loader met in its epoch 0: a fast-forwarded epoch, empty in a for loop
        # without even starting its workers (state/loader_iter.py, FastForward)
        tracker.resume_at = {"epoch": 1, "batches": length, "length": length, "epoch_rng": None}
        tracker.relative = tracker.restore_pending = False

    def check_inputs(self, tracker: LoaderTracker, position: dict[str, Any]) -> None:
        """ConfigError when the loader's position would mean other samples now (unless
        allowed: then a warning)."""
        loader = tracker.loader_ref()
        saved = position.get("inputs")
        if loader is None or not isinstance(saved, dict):  # checkpoints before the record
            return
        changed = inputs.changes(saved, inputs.loader_inputs(loader))
        verdict = inputs.verdict(changed, command_changed=False, allowed=self.allow_changed_inputs)
        if verdict is inputs.Verdict.REFUSE:
            raise ConfigError(inputs.refusal(self.loaded.url, tracker.name, changed))
        if verdict is inputs.Verdict.WARN:
            log.warning(
                "ferry: warning: %s: resuming loader %s anyway (%s)",
                self.loaded.url,
                tracker.name,
                ", ".join(changed),
            )

    def check_command(self, argv: list[str]) -> None:
        """Warn when the script's command line differs from the checkpoint's."""
        meta = self.loaded.manifest.get("meta") or {}
        saved = meta.get("argv") if isinstance(meta, dict) else None
        if isinstance(saved, list) and all(isinstance(a, str) for a in saved):
            change = inputs.command_change(saved, argv)
            if change is not None:
                log.warning("ferry: warning: resuming %s with another %s", self.loaded.url, change)

    def apply(self, objects: dict[str, Any], loaders: Mapping[str, LoaderTracker], t0: float) -> float:
        """Restore everything now; returns the restore's seconds (load included) since ``t0``."""
        self.built_before_restore = loader_identity.built_so_far()
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
            tracker.pool_rng = position.get("pool_rng")
            tracker.resume_at, tracker.relative, tracker.restore_pending = None, False, False
        else:
            self.resume_loader(tracker, relative=True, driver=False)
