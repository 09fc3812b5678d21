"""The session object: tracked state, safe points, signals and control requests, and the
save and stop that follow from them. What to do at a safe point is decided in ``policy``;
how to write in ``checkpointer``; how to resume in ``restore``; what to tell in ``reporting``.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from ferry.config import Config
from ferry.engine import CheckpointInfo, Loaded
from ferry.engine.format import is_stateful
from ferry.engine.gcpause import paused_gc
from ferry.engine.transfer import Transfer, TransferPolicy
from ferry.errors import FerryError, UnsupportedStateError, bug
from ferry.knobs import STATUS_SECONDS
from ferry.progress import Tally
from ferry.runtime.control import ControlInbox, Request
from ferry.runtime.distributed import end_rank, speaks_for_node
from ferry.runtime.identity import default_job_id
from ferry.runtime.jobdir import JobDir
from ferry.runtime.procs import own_process
from ferry.runtime.signals import SignalRequests
from ferry.schedulers import detect as detect_scheduler
from ferry.session import checkpointer, policy, resume, warm
from ferry.session.loophooks import LoopExtras, LoopHooks, LoopState
from ferry.session.reporting import Reporter
from ferry.session.rngwatch import GeneratorScan, GeneratorWatch
from ferry.session.savewatch import SaveWatch
from ferry.state import loader_identity
from ferry.state.generators import GeneratorState
from ferry.state.loader import LoaderTracker, protect_workers, shut_down_pools, track_loader, untrack_all
from ferry.state.training import TrainingState

log = logging.getLogger("ferry")


def _register_exit(hook: Callable[[], None]) -> None:
    """Run ``hook`` when the main thread ends, before concurrent.futures stops its thread
    pools (which atexit would be too late for: a save in flight needs them to commit); in
    this process only: a forked DataLoader worker inherits the hooks and runs them when it
    ends (multiprocessing calls ``threading._shutdown`` there)."""
    hook = own_process(hook)
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(hook)
            return
    except RuntimeError:  # interpreter already shutting down
        pass
    atexit.register(hook)


def _default_logging() -> None:
    """ferry's lines go to stderr unless the program configured logging itself."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


class Session(LoopHooks):
    """Everything ferry knows about the training loop of this process."""

    def __init__(self, config: Config | None = None, signals: SignalRequests | None = None) -> None:
        self.config = config or Config.from_env()
        # A warm worker (docs/jobs.md, "Warm migration") waits here, before it looks at the job
        # or writes anything of it, until the worker it replaces has handed its state over.
        warm_wait = warm.wait_for_takeover(self.config.stop_signals)
        _default_logging()
        if warm_wait is not None:
            log.info("ferry: taking over, after %.1f s at the restore point (a warm migration)", warm_wait)
        self.objects: dict[str, Any] = {}
        self.loaders: dict[str, LoaderTracker] = {}
        self.driver: LoaderTracker | None = None
        self.global_step = 0
        self.resumed = False
        self.restored_step: int | None = None
        self.extra_files: Any = None  # set by FunctionCheckpoint: () -> dict[name, bytes]
        self._resume: resume.Resume | None = None
        self._stopping = False
        self._closed = False
        self._last_step = -1
        self._last_time = time.monotonic()
        self._last_blocked = 0.0  # what the last save cost the training thread, seconds
        self._next_poll = 0.0
        self._next_status = time.monotonic() + STATUS_SECONDS
        self._requests: list[Request] = []
        self.job_id = self.config.job_id or os.environ.get("FERRY_JOB_ID") or default_job_id()
        # The job's status says "checkpointing" once a save writes, from the writing thread:
        # a status rewrite took milliseconds of the training thread at each save.
        tally = Tally(on_begin=lambda step: self.report.writing(step))
        self.checkpointer = checkpointer.for_process(
            self.config, self._committed, self._failed, tally, self._fatal
        )
        self.job = JobDir.create(self.job_id, self.config.job_dir)
        if not (self.checkpointer.leads or speaks_for_node(self.checkpointer.rank)):
            self.job.writer = False
            log.setLevel(logging.WARNING)  # rank 0 reports for the job, a node's first rank for its node
        self.job.write_identity(
            id=self.job_id, pid=os.getpid(), argv=[sys.executable, *sys.argv], checkpoint_dir=self.config.dir
        )
        if self.job.writer and "FERRY_SUPERVISOR_PID" not in os.environ:  # else `ferry run` holds it
            try:
                self.job.acquire_lock()
            except FerryError as exc:
                log.warning("ferry: %s", exc)
        self.inbox = ControlInbox(self.job)
        if signals is None:  # zero-code mode hands over the handlers armed at start-up
            signals = SignalRequests(self.config.stop_signals, self.config.checkpoint_signals)
            signals.install()
        self.signals = signals
        self.discover: Callable[[], dict[str, Any]] | None = None
        """Zero-code mode: finds the state to save at the restore point and each checkpoint."""
        self.uncaptured: GeneratorScan | None = None
        """Zero-code mode: finds what it sees but cannot capture (the script's own random
        generators); those training draws from after the first safe point are warned about."""
        self._generators: GeneratorWatch | None = None
        self.extras: LoopExtras | None = None
        """Zero-code mode: the files the script writes, rolled back with the state, and the
        loops in a library's code, said."""
        self.loop: LoopState | None = None
        """Zero-code mode: captures and restores the plain state of the loop's frames."""
        self.swapped: dict[int, Any] = {}
        """Values the last restore replaced in the loop's frames (id -> new value)."""
        self.last_batch_from: LoaderTracker | None = None
        self._driver_pinned = False
        self._trained = False  # past the first safe point
        self.transfer: Transfer | None = None  # docs/transfer.md
        if self.config.remote and self.checkpointer.leads:
            self.transfer = Transfer(self.config.dir, TransferPolicy(remote=self.config.remote))
            if self.config.resume:
                self.transfer.fetch_if_missing()
        # its scheduler's grace period is checked after each commit
        self.report = Reporter(self.config, self.job, self.inbox, detect_scheduler(), self.transfer, self)
        if self.config.resume:
            self._resume = resume.find(self.config.dir, self.checkpointer)
            if self._resume is not None:
                self.resumed, self.restored_step = True, self._resume.step
                self._resume.allow_changed_inputs = self.config.allow_changed_inputs
                if self.job.writer:  # one rank speaks for the job
                    self._resume.check_command(sys.argv)
            elif self.job.writer:
                resume.starting_fresh(self.config.dir, self.job_id, [sys.executable, *sys.argv])
        self.restoring = False
        """The checkpoint is being put back now (optimizer steps meanwhile are not training's)."""
        self._first_steps: list[float] | None = [] if self.resumed else None
        """After a resume: when the first safe points were passed (``ferry migrate`` takes the
        first step's warm-up, beyond the second's length, as part of the downtime)."""
        self.job.update_status("running", step=self.global_step, pid=os.getpid())
        # last: a session that failed to start leaves no thread behind
        self._save_watch = SaveWatch(self.job, tally) if self.job.writer else None
        _register_exit(self._atexit)
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def loaded(self) -> Loaded | None:
        """The checkpoint being resumed, or None when starting fresh."""
        return None if self._resume is None else self._resume.loaded

    # ------------------------------------------------------------------ tracking
    def track(self, **objects: Any) -> None:
        """Track objects by name: Stateful objects, plain dicts/lists, DataLoaders."""
        new_loaders = []
        for name, obj in objects.items():
            if isinstance(obj, DataLoader):
                tracker = track_loader(name, obj, self)
                protect_workers(obj, self.signals.signals)
                self.loaders[name] = tracker
                new_loaders.append(tracker)
                if self.driver is None or name == "loader":
                    self.driver = tracker
                    self._driver_pinned = name == "loader"
                elif loader_identity.succeeds(tracker.identity, self.driver.identity):
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
        found = self._resume
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
        return None if self._resume is None else self._resume.state.saved_object(name)

    # ------------------------------------------------------------------ restore
    def restore(self) -> int | None:
        """Restore the checkpoint now (instead of at the first safe point); returns its step."""
        if self._resume is None or self._resume.done:
            return self.restored_step
        self._restore_all()
        for tracker in self.loaders.values():
            self._resume.resume_loader(tracker, relative=True, driver=tracker is self.driver)
        return self.restored_step

    def _discover(self) -> None:
        if self.discover is not None:
            self.objects.update(self.discover())

    def _restore_all(self) -> None:
        self.restoring = True  # DCP's optimizer load takes a step of its own: not a training step
        try:
            self._restore_all_now()
        finally:
            self.restoring = False

    def _restore_all_now(self) -> None:
        if self._resume is None:
            raise bug("a restore without a checkpoint to resume from")
        t0 = time.perf_counter()
        self._discover()
        seconds = self._resume.apply(self.objects, self.loaders, t0)
        self.global_step = self._last_step = self._resume.state.global_step
        saved = self._resume.state.frames
        if self.loop is not None and saved is not None:
            self.swapped = self.loop.restore(saved)
            if self.extras is not None:
                for problem in self.extras.restore(saved):
                    log.warning("ferry: warning: %s", problem)
        if self._resume.in_place:
            for tracker in self.loaders.values():
                if tracker is not self.driver:
                    self._resume.after_in_place(tracker)
        self.report.resumed(self._resume.loaded.url, self.global_step, seconds)

    def step(self) -> None:
        """Mark the end of a training iteration: a safe point. Without a tracked DataLoader it
        also counts the step (with one, the loader's batches are the steps)."""
        if self.driver is None:
            self.global_step += 1
        self._safe_point()

    def request(self, action: str = "checkpoint") -> None:
        """Ask for a checkpoint (or a checkpoint and stop) at the next safe point."""
        self._requests.append(Request(f"local-{time.time_ns()}", action, time.time()))

    # ------------------------------------------------------------------ safe points
    def _safe_point(self) -> None:
        entered = time.perf_counter()  # a save here blocked training from now (CheckpointInfo)
        self.signals.at_safe_points = True  # a stop signal now waits for the next one
        for signum, handler in self.signals.reassert():
            self.report.handler_replaced(signum, handler)
        if policy.idle(stopping=self._stopping, restore_pending=self._restore_pending):
            return
        if not self._trained:
            self._first_safe_point()
        if self._first_steps is not None:
            self._time_first_steps()
        now = self._between_safe_points()
        point = self._point(now)
        wish = policy.wish(point)
        if not self.checkpointer.listens(
            self.global_step,
            every_steps=self.config.every_steps,
            last_saved_step=self._last_step,
            wishing=wish.save or wish.stop,
        ):
            return  # between the ranks' agreements: requests and signals wait for the next
        decision = policy.decide_at_safe_point(point, self.checkpointer.agree(point, wish))
        if decision.action is policy.SafePointAction.NOTHING:
            return
        self.signals.checkpoint_requested = False
        requests, self._requests = self._requests, []
        if decision.action is policy.SafePointAction.STOP:
            self._stop(requests, decision.why, entered)
        else:
            self._save(requests, entered)
            self._last_blocked = time.perf_counter() - entered

    def _between_safe_points(self) -> float:
        """What every batch does, safe point or not: control requests are read and the status
        beats (for `ferry list` / `ferry status`); returns the time it looked at."""
        now = time.monotonic()
        if now >= self._next_poll:
            self._requests.extend(self.inbox.poll())
            self._next_poll = now + self.config.control_poll_seconds
        if now >= self._next_status:
            self.job.update_status("running", step=self.global_step)
            self._check_generators()
            self._next_status = now + STATUS_SECONDS
        return now

    def _point(self, now: float) -> policy.SafePoint:
        return policy.SafePoint(
            now=now,
            step=self.global_step,
            last_saved_step=self._last_step,
            last_saved_time=self._last_time,
            every_steps=self.config.every_steps,
            every_seconds=self.config.every_seconds,
            stop_signal=self.signals.stop_signal,
            checkpoint_signal=self.signals.checkpoint_requested,
            requests=tuple(r.action for r in self._requests),
            saving=self.checkpointer.busy(),
            last_blocked=self._last_blocked if self.checkpointer.world_size == 1 else 0.0,
        )

    def _first_safe_point(self) -> None:
        """Training runs: the worker's start-up ends here (``ferry report`` draws it), and the
        script's generators are looked at, to tell later which ones training draws from."""
        self._trained = True
        self.job.event("training_start", step=self.global_step)
        if self.loop is not None:
            self._discover()
            self.loop.examine(self.objects, self._driving_loader())
            if self.extras is not None:
                self.extras.examine()
        if self.uncaptured is not None:
            self._generators = GeneratorWatch(self.uncaptured, self.config.ignore_generators)
            self._generators.start()

    def _time_first_steps(self) -> None:
        """At the third safe point after a resume: the ``first_step`` event, with the lengths
        of the first two steps."""
        if self._first_steps is None:
            raise bug("the first steps after a resume are timed without a start")
        self._first_steps.append(time.monotonic())
        if len(self._first_steps) == 3:
            a, b, c = self._first_steps
            self._first_steps = None
            self.job.event("first_step", step=self.global_step, seconds=b - a, next_seconds=c - b)

    def _check_generators(self) -> None:
        if self._generators is not None:
            self._generators.check()

    # ------------------------------------------------------------------ checkpoints
    def _capture(self) -> TrainingState:
        self._discover()
        # A loader that is gone (one an evaluate() call built and dropped) has no position
        # to resume; forgetting it also keeps the checkpoint from growing with every call.
        self.loaders = {
            n: t for n, t in self.loaders.items() if t.loader_ref() is not None or t is self.driver
        }
        return TrainingState.capture(
            self.objects,
            self.loaders,
            global_step=self.global_step,
            driver=None if self.driver is None else self.driver.name,
            keep_objects=self.checkpointer.keeps_objects,
            frames=self._loop_state(),
        )

    def _loop_state(self) -> dict[str, Any] | None:
        if self.loop is None:
            return None
        state = self.loop.capture(self.objects, self._driving_loader())
        if self.extras is not None:
            state.update(self.extras.capture())
        return state

    def _driving_loader(self) -> DataLoader[Any] | None:
        return None if self.driver is None else self.driver.loader_ref()

    def _save(self, requests: list[Request], entered: float) -> None:
        self._check_generators()
        self._last_step, self._last_time = self.global_step, time.monotonic()
        self.report.awaiting(self.global_step, requests)
        try:
            self._write(entered, blocking=not self.config.async_save)
        except FerryError as exc:
            self._failed(self.global_step, exc)

    def _write(self, entered: float, blocking: bool, hand_over: bool = False) -> CheckpointInfo | None:
        """Save the state: in the background when the checkpointer can and ``blocking`` is
        False; the files of a FunctionCheckpoint are written first, the state captured after.
        ``hand_over``: also for the process that restarts this one (``Checkpointer``).
        ``entered``: when the safe point began, from which training counts as blocked."""
        # No collector pass while the state is gathered: a full one walks every object of
        # the process (tens of ms with torch imported), and the capture makes it likelier.
        with paused_gc():
            extra = self.extra_files() if self.extra_files else None
            return self.checkpointer.write(
                self._capture(),
                objects=self.objects,
                meta={"job_id": self.job_id, "argv": sys.argv},
                extra_files=extra,
                blocking=blocking,
                hand_over=hand_over,
                since=entered,
            )

    def _committed(self, info: CheckpointInfo) -> None:
        self.report.committed(info)

    def _failed(self, step: int, exc: Exception) -> None:
        self.report.failed(step, exc)

    def _fatal(self, why: str, code: int) -> None:
        """This rank cannot go on with the job (a stalled peer, a root the nodes do not
        share): the job's records say why, and the process ends now (from any thread)."""
        self.report.fatal(self.global_step, why)
        end_rank(why, code)

    def _stop(self, requests: list[Request], why: str, entered: float) -> None:
        self._stopping = True
        restart = next((r.env or {} for r in requests if r.action == "restart"), None)
        self.report.stopping(self.global_step, why)
        try:
            try:
                self.checkpointer.wait()
            except FerryError as exc:
                log.warning("ferry: the previous checkpoint had failed: %s", exc)
            self.report.awaiting(self.global_step, requests)
            self._last_step = self.global_step
            info = self._write(entered, blocking=True, hand_over=restart is not None)
            if info is None:
                raise bug("a blocking save returned no checkpoint")
        except Exception as exc:  # whatever went wrong, the job must say so and exit distinctly
            code = self.report.stop_failed(self.global_step, exc, requests)
            self.close()
            raise SystemExit(code) from exc
        code = self.report.stopped(info, restart)
        self.report.overtaken(info)
        self.close()
        raise SystemExit(code)

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Wait for the save in flight, put signal handlers and hooks back, release the job."""
        if self._closed:
            return
        self._serve_pending()
        self._closed = True
        self._check_generators()
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

    def _serve_pending(self) -> None:
        """A checkpoint asked for (``ferry.checkpoint()``, ``ferry checkpoint``) and not yet
        served when the session closes: served now where this process alone decides and the
        script's state is whole (explicit mode, one rank); otherwise answered as dropped,
        with the reason, never dropped in silence."""
        requests = [r for r in self._requests if r.action == "checkpoint"]
        if not requests or self._stopping:
            return
        self._requests = [r for r in self._requests if r.action != "checkpoint"]
        if self.loop is None and self.checkpointer.world_size == 1:
            self.report.awaiting(self.global_step, requests)
            try:
                self.checkpointer.agree(self._point(time.monotonic()), policy.Wish(save=True))
                self._write(time.perf_counter(), blocking=True)
            except FerryError as exc:
                self._failed(self.global_step, exc)
            return
        why = (
            "the script ended before its next safe point"
            if self.loop is not None
            else f"the {self.checkpointer.world_size} ranks had not reached the step they agree at"
        )
        self.report.dropped(self.global_step, requests, why)

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
            if self.signals.stop_signal is not None and not self._stopping:
                self.report.stop_missed(self.signals.stop_signal, self.global_step)
            self.close()
            self.report.finished(self.global_step)
