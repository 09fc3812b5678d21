"""The session object: the tracked state and the public calls over it, made of the parts
``startup`` opens (``Session.start``). What to do at a safe point is decided in ``policy``
and done by ``safepoints``; how a save is written and a stop ends in ``saving``; what the
training loop tells the session in ``loophooks``; how to resume in ``resume``; what to tell
in ``reporting``.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from ferry.config import Config
from ferry.engine import Loaded
from ferry.engine.codec import is_stateful
from ferry.errors import FerryError, UnsupportedStateError, bug
from ferry.runtime.control import Request
from ferry.runtime.signals import SignalRequests
from ferry.session import startup
from ferry.session.loophooks import LoopExtras, LoopHooks, LoopState
from ferry.session.rngwatch import GeneratorScan
from ferry.session.safepoints import SafePoints
from ferry.session.saving import Saves
from ferry.state import loader_identity
from ferry.state.generators import GeneratorState
from ferry.state.loader import LoaderTracker, protect_workers, shut_down_pools, track_loader, untrack_all

log = logging.getLogger("ferry")


class Session:
    """Everything ferry knows about the training loop of this process. ``start`` opens one;
    the constructor only keeps the parts it is given."""

    def __init__(self, parts: startup.Parts) -> None:
        self.config, self.job_id, self.job, self.inbox = parts.config, parts.job_id, parts.job, parts.inbox
        self.signals, self.checkpointer, self.report = parts.signals, parts.checkpointer, parts.report
        self.transfer, self._save_watch = parts.transfer, parts.save_watch
        self.found = parts.found
        """The checkpoint being resumed, or None when starting fresh."""
        self.resumed = parts.found is not None
        self.restored_step: int | None = None if parts.found is None else parts.found.step
        self.objects: dict[str, Any] = {}
        self.loaders: dict[str, LoaderTracker] = {}
        self.driver: LoaderTracker | None = None
        """The loader whose batches are the training steps."""
        self.driver_pinned = False
        self.last_batch_from: LoaderTracker | None = None
        self.framework: str | None = None
        """A framework's support drives training (``LoopHooks.framework_drives``)."""
        self.global_step = 0
        self.extra_files: Callable[[], dict[str, bytes]] | None = None  # set by FunctionCheckpoint
        self.discover: Callable[[], dict[str, Any]] | None = None
        """Zero-code mode: finds the state to save at the restore point and each checkpoint."""
        self.uncaptured: GeneratorScan | None = None
        """Zero-code mode: finds what it sees but cannot capture (the script's own random
        generators); those training draws from after the first safe point are warned about."""
        self.extras: LoopExtras | None = None
        """Zero-code mode: the files the script writes, rolled back with the state, and the
        loops in a library's code, said."""
        self.loop: LoopState | None = None
        """Zero-code mode: captures and restores the plain state of the loop's frames."""
        self.swapped: dict[int, Any] = {}
        """Values the last restore replaced in the loop's frames (id -> new value)."""
        self.restoring = False
        """The checkpoint is being put back now (optimizer steps meanwhile are not training's)."""
        self._closed = False
        self._previous_excepthook = sys.excepthook
        self.saves = Saves(
            self,
            config=self.config,
            checkpointer=self.checkpointer,
            report=self.report,
            job_id=self.job_id,
            started=parts.started,
            close=self.close,
        )
        self.points = SafePoints(
            self,
            self.saves,
            config=self.config,
            signals=self.signals,
            checkpointer=self.checkpointer,
            report=self.report,
            inbox=self.inbox,
            job=self.job,
            started=parts.started,
            resumed=self.resumed,
        )
        self.loop_hooks = LoopHooks(self, self.points, self.restore_all)
        """What a tracked loader, an optimizer step or a framework's support tells the session."""

    @classmethod
    def start(cls, config: Config | None = None, signals: SignalRequests | None = None) -> Session:
        """Open the session of this process (``startup.open_parts`` says what that does) with
        ``config`` (default: from FERRY_* variables) and ``signals`` (zero-code mode hands
        over the handlers armed at start-up; default: installed now); its end is the end of
        the main thread, or an uncaught exception."""
        parts = startup.open_parts(config, signals)
        session = cls(parts)
        parts.relay.progress = session
        startup.register_exit(session._atexit)
        sys.excepthook = session._excepthook
        return session

    @property
    def stopping(self) -> bool:
        return self.saves.stopping

    @property
    def loaded(self) -> Loaded | None:
        """The checkpoint being resumed, or None when starting fresh."""
        return None if self.found is None else self.found.loaded

    # ------------------------------------------------------------------ tracking
    def track(self, **objects: Any) -> None:
        """Track objects by name: Stateful objects, plain dicts/lists, DataLoaders."""
        new_loaders = []
        for name, obj in objects.items():
            if isinstance(obj, DataLoader):
                tracker = track_loader(name, obj, self.loop_hooks)
                protect_workers(obj, self.signals.signals)
                self.loaders[name] = tracker
                new_loaders.append(tracker)
                if self.driver is None or name == "loader":
                    self.driver = tracker
                    self.driver_pinned = name == "loader"
                elif loader_identity.succeeds(tracker.identity, self.driver.identity, self.driver.began):
                    tracker.feeding.inherit(self.driver.feeding)
                    self.driver = tracker  # the script builds its training loader anew each epoch
            elif is_stateful(obj) or isinstance(obj, (dict, list)):
                self.objects[name] = obj
            elif GeneratorState.accepts(obj):
                self.objects[name] = GeneratorState(obj)
            else:
                raise UnsupportedStateError(
                    f"ferry.track({name}=...) got a {type(obj).__name__}: track objects with "
                    "state_dict()/load_state_dict(), dicts or lists updated in place, random "
                    "generators, or DataLoaders"
                )
        found = self.found
        if found is None:
            return
        if found.done:  # tracked after the restore: catch up now
            found.catch_up({k: self.objects[k] for k in objects if k in self.objects}, new_loaders)
        elif self.loaders:
            found.pending = True
            if found.state.driver in self.loaders:
                self.driver = self.loaders[found.state.driver]
            for tracker in new_loaders:
                found.resume_loader(tracker, relative=False, driver=tracker is self.driver)
        elif self.loop is None:  # zero-code mode restores at the loop's restore point
            self.restore()

    def leave_zero_code(self, objects: dict[str, Any], *, steps: bool = False) -> None:
        """The script calls ``ferry.track`` or ``ferry.step``: if it tracks its loader, model
        or optimizer, or marks its own steps, it uses the explicit API, and zero-code mode's
        discovery and loop capture step aside (a script that tracks only lists, dicts or
        generators stays in zero-code mode, with those added)."""
        if not steps and not any(isinstance(o, (DataLoader, nn.Module, Optimizer)) for o in objects.values()):
            return
        self.discover = None
        self.uncaptured = None
        self.loop = None

    def saved_state(self, name: str) -> Any:
        """The state saved under ``name`` in the checkpoint being resumed, or None when starting
        fresh: for integrations that need a value (an epoch) before the objects can be tracked."""
        return None if self.found is None else self.found.state.saved_object(name)

    # ------------------------------------------------------------------ restore
    def restore(self) -> int | None:
        """Restore the checkpoint now (instead of at the first safe point); returns its step."""
        if self.found is None or self.found.done:
            return self.restored_step
        self.restore_all()
        for tracker in self.loaders.values():
            self.found.resume_loader(tracker, relative=True, driver=tracker is self.driver)
        return self.restored_step

    def restore_all(self) -> None:
        """Put the checkpoint back into everything tracked, now (the restore point)."""
        found = self.found
        self.restoring = True  # DCP's optimizer load takes a step of its own: not a training step
        try:
            if found is None:
                raise bug("a restore without a checkpoint to resume from")
            t0 = time.perf_counter()
            self.saves.discover()
            seconds = found.apply(self.objects, self.loaders, t0)
            self.global_step = self.saves.last_step = found.state.global_step
            saved = found.state.frames
            if self.loop is not None and saved is not None:
                self.swapped = self.loop.restore(saved)
                if self.extras is not None:
                    for problem in self.extras.restore(saved):
                        log.warning("ferry: warning: %s", problem)
            if found.in_place:
                for tracker in self.loaders.values():
                    if tracker is not self.driver:
                        found.after_in_place(tracker)
            self.report.resumed(found.loaded.url, self.global_step, seconds)
        finally:
            self.restoring = False

    def step(self) -> None:
        """Mark the end of a training iteration: a safe point. Without a tracked DataLoader it
        also counts the step (with one, the loader's batches are the steps)."""
        if self.driver is None:
            self.global_step += 1
        self.points.safe_point()

    def request(self, action: str = "checkpoint") -> None:
        """Ask for a checkpoint (or a checkpoint and stop) at the next safe point."""
        self.points.requests.append(Request(f"local-{time.time_ns()}", action, time.time()))

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Wait for the save in flight, put signal handlers and hooks back, release the job."""
        if self._closed:
            return
        self.points.serve_pending()
        self._closed = True
        self.points.check_generators()
        try:
            self.checkpointer.close()
        except FerryError as exc:
            log.error("ferry: the last checkpoint failed: %s", exc)
        finally:
            if self._save_watch is not None:
                self._save_watch.close()
        if self.transfer is not None:
            self.transfer.close(self.config.grace_seconds)
        self.signals.uninstall()
        self.job.release_lock()
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_excepthook
        untrack_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def _excepthook(self, kind: type[BaseException], value: BaseException, tb: Any) -> None:
        """An uncaught exception ends the job as failed, not finished."""
        self.report.crashed(self.global_step, kind, value)
        self._previous_excepthook(kind, value, tb)

    def _atexit(self) -> None:
        shut_down_pools()
        if not self._closed:
            if self.signals.stop_signal is not None and not self.saves.stopping:
                self.report.stop_missed(self.signals.stop_signal, self.global_step)
            self.close()
            self.report.finished(self.global_step)
