"""How this process writes its checkpoints: alone, or as one rank of several. Chosen once,
at start (``for_process``), so the session never asks which."""

from __future__ import annotations

import functools
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from ferry.config import Config
from ferry.engine import AsyncSaver, CheckpointInfo, Loaded, sharded
from ferry.engine.ranksave import RankSaver
from ferry.errors import ConfigError
from ferry.progress import Tally
from ferry.runtime import handoff
from ferry.runtime.distributed import (
    UNKNOWN_NS,
    AbortOnCrash,
    RankGroup,
    Vote,
    WaitBeforeTeardown,
    end_rank,
    node_name,
    replicated,
    speaks_for_node,
)
from ferry.runtime.peerwatch import PeerWatch
from ferry.session import agreement
from ferry.session.overlap import Overlap
from ferry.session.policy import Asked, SafePoint
from ferry.state.training import TrainingState

OnCommit = Callable[[CheckpointInfo], None]
OnError = Callable[[int, Exception], None]
OnFatal = Callable[[str, int], None]
"""A rank that cannot go on with the job (why, the exit status): reports it, ends the process."""


class Checkpointer(Protocol):
    """Writes the session's checkpoints. Every call is made on the training thread:

    1. ``take_handed_over()`` once at start, before looking for a checkpoint on disk;
    2. ``may_agree_at(step, ...)`` at every safe point that is not idle: can this one lead to a
       save or a stop? If not (the ranks agree only now and then), the session skips it at
       no cost; if so, ``busy()`` for the safe point's values, then ``agree(point, asked)``
       (across ranks, a collective: the same safe points on every rank);
    3. ``keeps_objects(objects)`` while capturing: does this process save the objects?
    4. ``write(...)`` to save; a commit is reported to ``on_commit``, a failure of a
       background save to ``on_error`` (a failure inside ``write`` raises). ``since``: when
       the training thread stopped for it (``time.perf_counter()`` at the safe point's
       entry), from which the commit's ``blocking_seconds`` counts what training lost;
    5. ``wait()`` before the save of a stop; a stop for a restart writes with ``hand_over``:
       the state is also left for the process that takes over (where the checkpointer can);
    6. ``close()`` at teardown.
    """

    rank: int
    world_size: int

    @property
    def reports_for_job(self) -> bool:
        """This process reports for the job (its status, events and log lines)."""
        ...

    def take_handed_over(self) -> Loaded | None: ...
    def may_agree_at(
        self, step: int, *, every_steps: int | None, last_saved_step: int, asked: bool
    ) -> bool: ...
    def agree(self, point: SafePoint, asked: Asked) -> Asked: ...
    def keeps_objects(self, objects: dict[str, Any]) -> bool: ...
    def busy(self) -> bool:
        """A save is still being written, and a save asked for now may wait until the next
        safe point after it (``policy.decide_at_safe_point``)."""
        ...

    def write(
        self,
        state: TrainingState,
        *,
        objects: dict[str, Any],
        meta: dict[str, Any],
        extra_files: dict[str, bytes] | None,
        blocking: bool,
        hand_over: bool = False,
        since: float | None = None,
    ) -> CheckpointInfo | None: ...
    def wait(self) -> None: ...
    def close(self) -> None: ...


def for_process(
    config: Config,
    on_commit: OnCommit,
    on_error: OnError,
    tally: Tally | None = None,
    on_fatal: OnFatal | None = None,
) -> Checkpointer:
    """``tally`` counts the bytes of each save as they are written (``ferry.progress``);
    ``on_fatal``: a rank of several that cannot go on (a stalled peer, a root the nodes do
    not share) reports through it, and the process ends."""
    group = RankGroup.detect()
    if group is None:
        return LocalCheckpointer(config, on_commit, on_error, tally)
    return RankedCheckpointer(config, group, on_commit, on_error, tally, on_fatal)


class LocalCheckpointer:
    """One process: the snapshot blocks training, the write goes on in the background; a
    restart may hand its state over in host memory."""

    rank, world_size = 0, 1

    def __init__(
        self, config: Config, on_commit: OnCommit, on_error: OnError, tally: Tally | None = None
    ) -> None:
        self.config = config
        self.saver = AsyncSaver(
            config.dir,
            keep_last=config.keep_last,
            keep_every=config.keep_every,
            on_commit=on_commit,
            on_error=on_error,
            tally=tally,
        )
        self.overlap = Overlap(self.saver.copied) if config.overlap_snapshot else None

    @property
    def reports_for_job(self) -> bool:
        return True

    def take_handed_over(self) -> Loaded | None:
        if not self.config.handoff_dir:
            return None
        return handoff.take(self.config.handoff_dir, self.config.dir)

    def may_agree_at(self, step: int, *, every_steps: int | None, last_saved_step: int, asked: bool) -> bool:
        return True

    def agree(self, point: SafePoint, asked: Asked) -> Asked:
        return asked

    def keeps_objects(self, objects: dict[str, Any]) -> bool:
        return True

    def busy(self) -> bool:
        return self.saver.busy()

    def write(
        self,
        state: TrainingState,
        *,
        objects: dict[str, Any],
        meta: dict[str, Any],
        extra_files: dict[str, bytes] | None,
        blocking: bool,
        hand_over: bool = False,
        since: float | None = None,
    ) -> CheckpointInfo | None:
        """``hand_over``: the same snapshot also goes to host memory, for the process that
        restarts this one (``ferry.runtime.handoff``), written while the checkpoint is."""
        where = self.config.handoff_dir if hand_over else None
        handle = self.saver.save(
            state.tree(),
            step=state.global_step,
            meta=meta,
            extra_files=extra_files,
            blocking=blocking,
            mirror=None if not where else functools.partial(handoff.leave, where),
            defer=None if self.overlap is None else self.overlap.defer(objects, blocking),
            since=since,
        )
        return handle.result() if blocking else None

    def wait(self) -> None:
        self.saver.wait()

    def close(self) -> None:
        try:
            self.saver.close()
        finally:
            if self.overlap is not None:
                self.overlap.close()


class RankedCheckpointer:
    """One rank of several. On the training thread, the ranks agree now and then
    (``agreement``) whether to save or stop, and every rank snapshots the same step; the
    writing and rank 0's commit go on in the background (``ferry.engine.ranksave``, through
    the job's store: background threads make no collective calls of ferry's own)."""

    def __init__(
        self,
        config: Config,
        group: RankGroup,
        on_commit: OnCommit,
        on_error: OnError,
        tally: Tally | None = None,
        on_fatal: OnFatal | None = None,
    ) -> None:
        self.config, self.group = config, group
        self.rank, self.world_size = group.rank, group.world_size
        self.saver = RankSaver(
            config.dir,  # a URL no backend takes fails now, not at the first save
            rank=self.rank,
            world_size=self.world_size,
            board=group.board(),
            keep_last=config.keep_last,
            keep_every=config.keep_every,
            on_commit=on_commit,
            on_error=on_error,
            tally=tally,
        )
        self.overlap = Overlap(self.saver.copied) if config.overlap_snapshot else None
        self._abort = AbortOnCrash(self.rank)
        self._teardown = WaitBeforeTeardown(self.wait)
        self._next = 0  # the step of the next agreement
        self._costs: deque[int] = deque(maxlen=8)  # this rank's last agreements, ns
        self._clock = agreement.StepClock()  # the step time this rank agrees on
        self._token = 0  # the last agreement's: names the save it decided
        self._shard_group: Any = None
        self._fatal = on_fatal or end_rank
        self._agreements = 0
        alone = self.world_size == 1  # a one-rank group (DCP's): no peer to wait for, no node to miss
        self.watch = None if config.stall_seconds is None or alone else self._peer_watch(config.stall_seconds)

    def _peer_watch(self, stall: float) -> PeerWatch:
        store = self.group.store(max(stall / 2, 1.0))
        where = f" at {store.host}:{store.port}" if hasattr(store, "host") else ""
        return PeerWatch(store, rank=self.rank, world_size=self.world_size, node=node_name(), stall=stall,
                         watch=speaks_for_node(self.rank), on_stall=lambda why: self._fatal(why, 1),
                         where=where)  # fmt: skip

    def _first_agreements(self, token: int) -> None:
        """After the ranks' first agreements (the same on every rank): the root must be one
        the nodes share (first), and the ranks watch each other from the second on."""
        self._agreements += 1
        if self._agreements == 1 and self.world_size > 1:
            blind = self.group.blind_to(self.config.dir)
            if blind:
                ranks = ", ".join(f"rank {r} (node {n})" for r, n in blind[:8]) + (
                    " ..." if len(blind) > 8 else ""
                )
                self._fatal(
                    f"the checkpoint root {self.config.dir} is not shared by the job's nodes: {ranks} cannot "
                    "see what rank 0 writes there (a folder on each node's own disk); a job on many nodes "
                    "needs one root that every node reaches: a shared filesystem, or an object store URL "
                    "(--dir s3://..., gs://...)",
                    ConfigError.exit_code,
                )
            if self.watch is not None:
                self.watch.begin(token)
        elif self._agreements == 2 and self.watch is not None:
            self.watch.start()

    @property
    def reports_for_job(self) -> bool:
        return self.rank == 0

    def take_handed_over(self) -> Loaded | None:
        return None  # a hand-over is one process's memory; ranks resume from storage

    def may_agree_at(self, step: int, *, every_steps: int | None, last_saved_step: int, asked: bool) -> bool:
        """Only where the ranks agree (``agreement``); elsewhere nothing happens, at no cost
        (the step's length is noted: ``agreement.StepClock``). A group of one rank agrees
        with itself at once whenever it wishes to save or stop (a 1-rank gloo group made
        for a DTensor model, whose fast steps put agreements hundreds of steps apart)."""
        self._clock.tick(step, time.perf_counter())
        if asked and self.world_size == 1:
            return True
        return agreement.agrees(step, self._next, every_steps=every_steps, last_saved_step=last_saved_step)

    def agree(self, point: SafePoint, asked: Asked) -> Asked:
        """Whichever rank was asked, every rank saves (or stops at) the same step: the next
        at which the ranks agree."""
        start = time.perf_counter()
        step = self._clock.take()
        step_ns = UNKNOWN_NS if step is None else int(step * 1e9)
        cost_ns = int(statistics.fmean(self._costs)) if self._costs else UNKNOWN_NS
        mine = Vote(asked.stop, asked.save, cost_ns, step_ns)
        agreed = self.group.agree(mine)
        if self._agreements < 2:
            self._first_agreements(agreed.token)
        end = time.perf_counter()
        self._costs.append(int((end - start) * 1e9))
        self._token = agreed.token
        self._clock.restart(point.step, end)  # the agreement's time is no step's
        pace = agreement.Pace(
            cost=None if agreed.cost_ns >= UNKNOWN_NS else agreed.cost_ns / 1e9,
            step=None if agreed.step_ns >= UNKNOWN_NS else agreed.step_ns / 1e9,
        )
        self._next = point.step + agreement.interval(pace)
        return Asked(stop=agreed.stop, save=agreed.save)

    def keeps_objects(self, objects: dict[str, Any]) -> bool:
        """Replicated (DDP) objects are written once, by rank 0."""
        return self.rank == 0 or not replicated(objects)

    def busy(self) -> bool:
        """Never: the ranks save the steps they agreed on, whatever one rank is writing."""
        return False

    def write(
        self,
        state: TrainingState,
        *,
        objects: dict[str, Any],
        meta: dict[str, Any],
        extra_files: dict[str, bytes] | None,
        blocking: bool,
        hand_over: bool = False,
        since: float | None = None,
    ) -> CheckpointInfo | None:
        """Every rank at the same step, right after the agreement that decided it."""
        self.saver.wait()  # before staging: host memory holds one save's state at a time
        self._clock.forget()  # the save's time is no step's
        shards, _ = sharded.split(objects)
        staged = None
        if shards:
            if self._shard_group is None:  # collective: every rank saves this step
                self._shard_group = self.group.background_group()
            staged = sharded.stage(shards)
        handle = self.saver.save(
            state.tree(),
            name=f"ferry/save/{self._token:016x}",
            step=state.global_step,
            meta=meta,
            extra_files=extra_files,
            shards=staged,
            shard_group=self._shard_group,
            blocking=blocking,
            defer=None if self.overlap is None else self.overlap.defer(objects, blocking),
            since=since,
        )
        return handle.result() if blocking else None

    def wait(self) -> None:
        """Until the save in flight is committed (or failed) on every rank."""
        self.saver.wait()

    def close(self) -> None:
        """Wait for the save in flight; a crash after this is no longer ferry's to handle."""
        try:
            self.saver.close()
        finally:
            if self.watch is not None:
                self.watch.close()
            if self.overlap is not None:
                self.overlap.close()
            self._teardown.remove()
            self._abort.disarm()
