"""How this process writes its checkpoints: alone, or as one rank of several. Chosen once,
at start (``for_process``), so the session never asks which."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ferry.config import Config
from ferry.engine import AsyncSaver, CheckpointInfo, Loaded, sharded
from ferry.engine.ranks import save_ranked
from ferry.runtime import handoff
from ferry.runtime.distributed import AbortOnCrash, RankGroup, replicated
from ferry.session.policy import Wish
from ferry.state.training import TrainingState
from ferry.storage import open_storage

OnCommit = Callable[[CheckpointInfo], None]
OnError = Callable[[int, Exception], None]


class Checkpointer(Protocol):
    """Writes the session's checkpoints. Every call is made on the training thread:

    1. ``take_handed_over()`` once at start, before looking for a checkpoint on disk;
    2. ``agree(wish)`` at every safe point that is not idle (a collective across ranks);
    3. ``keeps_objects(objects)`` while capturing: does this process save the objects?
    4. ``write(...)`` to save; a commit is reported to ``on_commit``, a failure of a
       background save to ``on_error`` (a failure inside ``write`` raises);
    5. ``wait()`` before the save of a stop, ``hand_over(...)`` after it, on a restart;
    6. ``close()`` at teardown.
    """

    rank: int
    world_size: int

    @property
    def leads(self) -> bool:
        """This process reports for the job (its status, events and log lines)."""
        ...

    def take_handed_over(self) -> Loaded | None: ...
    def agree(self, wish: Wish) -> Wish: ...
    def keeps_objects(self, objects: dict[str, Any]) -> bool: ...
    def write(
        self,
        state: TrainingState,
        *,
        objects: dict[str, Any],
        meta: dict[str, Any],
        extra_files: dict[str, bytes] | None,
        blocking: bool,
    ) -> CheckpointInfo | None: ...
    def wait(self) -> None: ...
    def hand_over(self, capture: Callable[[], TrainingState]) -> None: ...
    def close(self) -> None: ...


def for_process(config: Config, on_commit: OnCommit, on_error: OnError) -> Checkpointer:
    group = RankGroup.detect()
    if group is None:
        return LocalCheckpointer(config, on_commit, on_error)
    return RankedCheckpointer(config, group, on_commit)


class LocalCheckpointer:
    """One process: the snapshot blocks training, the write goes on in the background; a
    restart may hand its state over in host memory."""

    rank, world_size = 0, 1

    def __init__(self, config: Config, on_commit: OnCommit, on_error: OnError) -> None:
        self.config = config
        self.saver = AsyncSaver(
            config.dir,
            keep_last=config.keep_last,
            keep_every=config.keep_every,
            on_commit=on_commit,
            on_error=on_error,
        )

    @property
    def leads(self) -> bool:
        return True

    def take_handed_over(self) -> Loaded | None:
        if not self.config.handoff_dir:
            return None
        return handoff.take(self.config.handoff_dir, self.config.dir)

    def agree(self, wish: Wish) -> Wish:
        return wish

    def keeps_objects(self, objects: dict[str, Any]) -> bool:
        return True

    def write(
        self,
        state: TrainingState,
        *,
        objects: dict[str, Any],
        meta: dict[str, Any],
        extra_files: dict[str, bytes] | None,
        blocking: bool,
    ) -> CheckpointInfo | None:
        handle = self.saver.save(
            state.tree(), step=state.global_step, meta=meta, extra_files=extra_files, blocking=blocking
        )
        return handle.result() if blocking else None

    def wait(self) -> None:
        self.saver.wait()

    def hand_over(self, capture: Callable[[], TrainingState]) -> None:
        """Leave the state in host memory for the process that restarts this one."""
        if self.config.handoff_dir:
            state = capture()
            handoff.leave(self.config.handoff_dir, state.tree(), state.global_step)

    def close(self) -> None:
        self.saver.close()


class RankedCheckpointer:
    """One rank of several: every rank saves the same step, collectively, on the training
    thread (background threads make no collective calls), and rank 0 commits."""

    def __init__(self, config: Config, group: RankGroup, on_commit: OnCommit) -> None:
        self.config, self.group, self.on_commit = config, group, on_commit
        self.rank, self.world_size = group.rank, group.world_size
        open_storage(config.dir)  # a URL no backend takes fails now, not at the first save
        self._abort = AbortOnCrash(self.rank)

    @property
    def leads(self) -> bool:
        return self.rank == 0

    def take_handed_over(self) -> Loaded | None:
        return None  # a hand-over is one process's memory; ranks resume from storage

    def agree(self, wish: Wish) -> Wish:
        """Whichever rank was asked, every rank saves (or stops at) this step."""
        stop, save = self.group.agree(wish.stop, wish.save)
        return Wish(stop=stop, save=save)

    def keeps_objects(self, objects: dict[str, Any]) -> bool:
        """Replicated (DDP) objects are written once, by rank 0."""
        return self.rank == 0 or not replicated(objects)

    def write(
        self,
        state: TrainingState,
        *,
        objects: dict[str, Any],
        meta: dict[str, Any],
        extra_files: dict[str, bytes] | None,
        blocking: bool,
    ) -> CheckpointInfo:
        shards, _ = sharded.split(objects)
        info = save_ranked(
            self.config.dir,
            self.group,
            state.tree(),
            step=state.global_step,
            meta=meta,
            keep_last=self.config.keep_last,
            keep_every=self.config.keep_every,
            shards=shards,
            extra_files=extra_files,
        )
        self.on_commit(info)
        return info

    def wait(self) -> None:
        """Nothing is ever in flight: a multi-rank save returns once committed."""

    def hand_over(self, capture: Callable[[], TrainingState]) -> None:
        """Ranks resume from storage."""

    def close(self) -> None:
        """Nothing to wait for; a crash after this is no longer ferry's to handle."""
        self._abort.disarm()
