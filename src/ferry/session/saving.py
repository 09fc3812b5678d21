"""The saves a safe point decides on: the state captured (zero-code discovery and the loop's
frames included), a checkpoint written in the background or waited for, and the stop: a
checkpoint waited for, then the exit with the status that says what happened. When a save
is due is ``policy``'s; what follows a commit is the reporter's (``savereport``)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from torch.utils.data import DataLoader

from ferry.config import Config
from ferry.engine import CheckpointInfo
from ferry.engine.gcpause import paused_gc
from ferry.errors import FerryError, bug
from ferry.runtime.control import Request
from ferry.session.checkpointer import Checkpointer
from ferry.session.loophooks import LoopExtras, LoopState
from ferry.session.reporting import Reporter
from ferry.state.loader import LoaderTracker
from ferry.state.training import TrainingState

log = logging.getLogger("ferry")


class Tracked(Protocol):
    """The training state a save captures (``Session`` has it)."""

    objects: dict[str, Any]
    loaders: dict[str, LoaderTracker]
    driver: LoaderTracker | None
    global_step: int
    loop: LoopState | None
    extras: LoopExtras | None
    discover: Callable[[], dict[str, Any]] | None
    extra_files: Callable[[], dict[str, bytes]] | None


class Saves:
    """Writes the checkpoints of this process's session and stops it."""

    def __init__(
        self,
        state: Tracked,
        *,
        config: Config,
        checkpointer: Checkpointer,
        report: Reporter,
        job_id: str,
        started: float,
        close: Callable[[], None],
    ) -> None:
        self.state, self.config, self.checkpointer, self.report = state, config, checkpointer, report
        self.job_id, self._close = job_id, close
        self.stopping = False
        self.last_step = -1
        """The step of the last save or restore (-1 before either)."""
        self.last_time = started
        """When the last save began (the session's start before any)."""

    def discover(self) -> None:
        """Zero-code mode: add the state discovery finds now."""
        if self.state.discover is not None:
            self.state.objects.update(self.state.discover())

    def capture(self) -> TrainingState:
        state = self.state
        self.discover()
        # A loader that is gone (one an evaluate() call built and dropped) has no position
        # to resume; forgetting it also keeps the checkpoint from growing with every call.
        state.loaders = {
            n: t for n, t in state.loaders.items() if t.loader_ref() is not None or t is state.driver
        }
        return TrainingState.capture(
            state.objects,
            state.loaders,
            global_step=state.global_step,
            driver=None if state.driver is None else state.driver.name,
            keep_objects=self.checkpointer.keeps_objects,
            frames=self._loop_state(),
        )

    def _loop_state(self) -> dict[str, Any] | None:
        loop, extras = self.state.loop, self.state.extras
        if loop is None:
            return None
        state = loop.capture(self.state.objects, self.driving_loader())
        if extras is not None:
            state.update(extras.capture())
        return state

    def driving_loader(self) -> DataLoader[Any] | None:
        driver = self.state.driver
        return None if driver is None else driver.loader_ref()

    def save(self, requests: list[Request], entered: float) -> None:
        """A save that training goes on after (in the background where configured)."""
        self.last_step, self.last_time = self.state.global_step, time.monotonic()
        self.report.saves.awaiting(self.state.global_step, requests)
        try:
            self.write(entered, blocking=not self.config.async_save)
        except FerryError as exc:
            self.report.saves.failed(self.state.global_step, exc)

    def write(self, entered: float, blocking: bool, hand_over: bool = False) -> CheckpointInfo | None:
        """Save the state: in the background when the checkpointer can and ``blocking`` is
        False; the files of a FunctionCheckpoint are written first, the state captured after.
        ``hand_over``: also for the process that restarts this one (``Checkpointer``).
        ``entered``: when the safe point began, from which training counts as blocked."""
        # No collector pass while the state is gathered: a full one walks every object of
        # the process (tens of ms with torch imported), and the capture makes it likelier.
        with paused_gc():
            extra = self.state.extra_files() if self.state.extra_files else None
            return self.checkpointer.write(
                self.capture(),
                objects=self.state.objects,
                meta={"job_id": self.job_id, "argv": sys.argv},
                extra_files=extra,
                blocking=blocking,
                hand_over=hand_over,
                since=entered,
            )

    def stop(self, requests: list[Request], why: str, entered: float) -> None:
        """Save, wait for the commit, close the session and exit: raises ``SystemExit`` with
        the status that says whether the checkpoint committed."""
        self.stopping = True
        step = self.state.global_step
        restart = next((r.env or {} for r in requests if r.action == "restart"), None)
        self.report.stopping(step, why)
        try:
            try:
                self.checkpointer.wait()
            except FerryError as exc:
                log.warning("ferry: the previous checkpoint had failed: %s", exc)
            self.report.saves.awaiting(step, requests)
            self.last_step = step
            info = self.write(entered, blocking=True, hand_over=restart is not None)
            if info is None:
                raise bug("a blocking save returned no checkpoint")
        except Exception as exc:  # whatever went wrong, the job must say so and exit distinctly
            code = self.report.stop_failed(step, exc, requests)
            self._close()
            raise SystemExit(code) from exc
        code = self.report.stopped(info, restart)
        self.report.overtaken(info)
        self._close()
        raise SystemExit(code)
