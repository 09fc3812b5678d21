"""The in-process session: tracked state, safe points, signals, control requests, save and
restore. One per process; ``ferry.track`` makes it on first use.

A *safe point* lies between two training iterations: when the driving DataLoader is asked
for its next batch, or at ``ferry.step()``. Signals and control requests only set flags;
checkpoints are taken at safe points only.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.utils.data import DataLoader

from ferry.config import Config
from ferry.engine import AsyncSaver, CheckpointInfo, Loaded, apply_state, load, sharded
from ferry.engine.format import is_stateful
from ferry.engine.ranks import save_ranked
from ferry.engine.transfer import Transfer, TransferPolicy
from ferry.errors import FerryError, NoCheckpointError, UnsupportedStateError
from ferry.runtime import handoff
from ferry.runtime.control import ControlInbox, Request
from ferry.runtime.distributed import RankGroup, rank_view, replicated
from ferry.runtime.jobdir import JobDir
from ferry.runtime.signals import SignalRequests
from ferry.schedulers import detect as detect_scheduler
from ferry.state.generators import GeneratorState
from ferry.state.grads import Gradients
from ferry.state.loader import Hooks, LoaderTracker, protect_workers, track_loader, untrack_all
from ferry.state.rng import GlobalRNG

log = logging.getLogger("ferry")
STATUS_SECONDS = 1.0


def _register_exit(hook: Callable[[], None]) -> None:
    """Run ``hook`` when the main thread ends, before concurrent.futures stops its thread
    pools (which atexit would be too late for: a save in flight needs them to commit)."""
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(hook)
            return
    except RuntimeError:  # interpreter already shutting down
        pass
    atexit.register(hook)


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def _default_logging() -> None:
    """ferry's lines go to stderr unless the program configured logging itself."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


class Session(Hooks):
    """Everything ferry knows about the training loop of this process."""

    def __init__(self, config: Config | None = None, signals: SignalRequests | None = None) -> None:
        self.config = config or Config.from_env()
        _default_logging()
        self.objects: dict[str, Any] = {}
        self.loaders: dict[str, LoaderTracker] = {}
        self.driver: LoaderTracker | None = None
        self.global_step = 0
        self.resumed = False
        self.restored_step: int | None = None
        self.extra_files: Any = None  # set by FunctionCheckpoint: () -> dict[name, bytes]
        self._loaded: Loaded | None = None
        self._load_seconds = 0.0
        self._restore_pending = False
        self._restored = False
        self._stopping = False
        self._closed = False
        self._last_step = -1
        self._last_time = time.monotonic()
        self._next_poll = 0.0
        self._next_status = time.monotonic() + STATUS_SECONDS
        self._requests: list[Request] = []
        self._awaiting: dict[int, list[Request]] = {}
        self.job_id = (
            self.config.job_id or os.environ.get("FERRY_JOB_ID") or f"{socket.gethostname()}-{os.getpid()}"
        )
        self.group = RankGroup.detect()
        self.scheduler = detect_scheduler()  # its grace period is checked after each commit
        self._warned_grace = False
        self.job = JobDir.create(self.job_id, self.config.job_dir)
        if self.group is not None and self.group.rank > 0:
            self.job.writer = False
            log.setLevel(logging.WARNING)  # rank 0 reports for the job
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
        self.last_batch_from: LoaderTracker | None = None
        self._driver_pinned = False
        self._warned_rngs = False
        self.saver = AsyncSaver(
            self.config.dir,
            keep_last=self.config.keep_last,
            keep_every=self.config.keep_every,
            on_commit=self._committed,
            on_error=self._failed,
        )
        self.transfer: Transfer | None = None  # docs/transfer.md
        if self.config.remote and self.job.writer:
            self.transfer = Transfer(self.config.dir, TransferPolicy(remote=self.config.remote))
            if self.config.resume:
                self.transfer.fetch_if_missing()
        if self.config.resume:
            self._find_checkpoint()
        self.job.update_status("running", step=self.global_step, pid=os.getpid())
        _register_exit(self._atexit)
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook

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
        if self._loaded is None:
            return
        saved = self._loaded.state["ferry"]
        if self._restored:  # tracked after the restore: catch up now
            self._apply_objects({k: self.objects[k] for k in objects if k in self.objects})
            for tracker in new_loaders:
                self._resume_loader(tracker, relative=True)
        elif self.loaders:
            self._restore_pending = True
            if saved.get("driver") in self.loaders:
                self.driver = self.loaders[saved["driver"]]
            for tracker in new_loaders:
                self._resume_loader(tracker, relative=False)
        else:
            self.restore()

    def _resume_loader(self, tracker: LoaderTracker, relative: bool) -> None:
        assert self._loaded is not None
        position = self._loaded.state["ferry"]["loaders"].get(tracker.name)
        if position is None:
            return
        tracker.resume_at = position
        tracker.relative = relative
        tracker.restore_pending = not relative and tracker is self.driver

    def saved_state(self, name: str) -> Any:
        """The state saved under ``name`` in the checkpoint being resumed, or None when starting
        fresh: for integrations that need a value (an epoch) before the objects can be tracked."""
        if self._loaded is None:
            return None
        return self._loaded.state.get("objects", {}).get(name)

    # ------------------------------------------------------------------ restore
    def _find_checkpoint(self) -> None:
        t0 = time.perf_counter()
        handed = None
        if self.config.handoff_dir and self.group is None:
            handed = handoff.take(self.config.handoff_dir, self.config.dir)
        try:
            self._loaded = handed or load(self.config.dir)
        except NoCheckpointError:
            return
        if handed is not None:
            log.info("ferry: the state of step %d was handed over in host memory", handed.step)
        self._loaded.state = rank_view(self._loaded, self.group)
        self.resumed = True
        self.restored_step = self._loaded.step
        self._load_seconds = time.perf_counter() - t0

    def restore(self) -> int | None:
        """Restore the checkpoint now (instead of at the first safe point); returns its step."""
        if self._loaded is None or self._restored:
            return self.restored_step
        self._apply_all()
        for tracker in self.loaders.values():
            self._resume_loader(tracker, relative=True)
        return self.restored_step

    def _apply_objects(self, objects: dict[str, Any]) -> None:
        assert self._loaded is not None
        saved = self._loaded.state["objects"]
        for name, obj in objects.items():
            if name in saved:
                apply_state(obj, saved[name], name)
            else:
                log.warning("ferry: %s is tracked but not in the checkpoint; it starts fresh", name)

    def _discover(self) -> None:
        if self.discover is not None:
            self.objects.update(self.discover())

    def _apply_all(self) -> None:
        assert self._loaded is not None
        t0 = time.perf_counter()
        self._discover()
        saved = self._loaded.state["ferry"]
        shards, objects = sharded.split(self.objects)
        self._apply_objects(objects)
        if shards:
            with_optim = saved.get("sharded_optimizers", {})
            sharded.load(shards, f"{self._loaded.url}/{sharded.DCP_DIR}", with_optim)
        GlobalRNG().load_state_dict(saved["rng"])
        for name, grads in saved.get("grads", {}).items():
            module = self.objects.get(name)
            if isinstance(module, nn.Module):
                Gradients(module).load_state_dict(grads)
        for name, tracker in self.loaders.items():
            if name in saved["loaders"]:
                tracker.restore_generators(saved["loaders"][name])
        self.global_step = self._last_step = int(saved["global_step"])
        self._restored, self._restore_pending = True, False
        seconds = self._load_seconds + time.perf_counter() - t0
        log.info(
            "ferry: resumed from %s at step %d (restore %.2f s)", self._loaded.url, self.global_step, seconds
        )
        self.job.update_status("resumed", step=self.global_step, resumed_from=self._loaded.url)
        self.job.event("resume", step=self.global_step, url=self._loaded.url, seconds=seconds)

    # ------------------------------------------------------------------ hooks
    def fast_forwarding(self, tracker: LoaderTracker) -> bool:
        return self._restore_pending

    def at_restore_point(self, tracker: LoaderTracker) -> None:
        if self._restore_pending:
            self._apply_all()

    def before_batch(self, tracker: LoaderTracker) -> None:
        if tracker is self.driver:
            self._safe_point()

    def after_batch(self, tracker: LoaderTracker) -> None:
        self.last_batch_from = tracker
        if tracker is self.driver:
            self.global_step += 1

    def note_optimizer_step(self) -> None:
        """The loader that fed the last batch before an optimizer step is the training loader."""
        feeding = self.last_batch_from
        if feeding is not None and feeding is not self.driver and not self._driver_pinned:
            log.info("ferry: %s feeds training; its batches are the safe points", feeding.name)
            self.driver = feeding
            self._driver_pinned = True

    def step(self) -> None:
        """Mark the end of a training iteration: a safe point. Without a tracked DataLoader it
        also counts the step (with one, the loader's batches are the steps)."""
        if self.driver is None:
            self.global_step += 1
        self._safe_point()

    def request(self, action: str = "checkpoint") -> None:
        """Ask for a checkpoint (or a checkpoint and stop) at the next safe point."""
        self._requests.append(Request(f"local-{time.time_ns()}", action, time.time()))

    # ------------------------------------------------------------------ checkpoints
    def _safe_point(self) -> None:
        if self._stopping or self._restore_pending:
            return
        if self.discover is not None and not self._warned_rngs:
            self._warn_uncaptured()
        now = time.monotonic()
        if now >= self._next_poll:
            self._requests.extend(self.inbox.poll())
            self._next_poll = now + self.config.control_poll_seconds
        if now >= self._next_status:  # a heartbeat for `ferry list` / `ferry status`
            self.job.update_status("running", step=self.global_step)
            self._next_status = now + STATUS_SECONDS
        stop = self.signals.stop_signal is not None or any(r.action != "checkpoint" for r in self._requests)
        every = self.config.every_steps
        due = (every is not None and self.global_step > 0 and self.global_step % every == 0) or (
            self.config.every_seconds is not None and now - self._last_time >= self.config.every_seconds
        )
        want = (due and self.global_step != self._last_step) or bool(self._requests)
        want = want or self.signals.checkpoint_requested
        if self.group is not None:  # whichever rank was asked, every rank saves this step
            stop, want = self.group.agree(stop, want)
        if not (stop or want):
            return
        self.signals.checkpoint_requested = False
        requests, self._requests = self._requests, []
        if stop:
            self._stop(requests)
        else:
            self._save(requests)

    def _warn_uncaptured(self) -> None:
        self._warned_rngs = True
        from ferry.autotrack.discovery import uncaptured_rngs

        for what in uncaptured_rngs():
            log.warning(
                "ferry: warning: the script's global %s is not captured in zero-code mode "
                "and a resumed run may differ; ferry.track() it",
                what,
            )

    def _tree(self) -> dict[str, Any]:
        self._discover()
        _, objects = sharded.split(self.objects)  # sharded models go through DCP, beside the tree
        shared = self.group is None or self.group.rank == 0 or not replicated(objects)
        return {
            **({"objects": objects} if shared else {}),
            "ferry": {
                "global_step": self.global_step,
                "rng": GlobalRNG(),
                "grads": {n: Gradients(m) for n, m in objects.items() if isinstance(m, nn.Module)},
                "loaders": {name: t.position() for name, t in self.loaders.items()},
                "driver": None if self.driver is None else self.driver.name,
            },
        }

    def _meta(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "argv": sys.argv}

    def _save(self, requests: list[Request]) -> None:
        self._last_step, self._last_time = self.global_step, time.monotonic()
        self.job.update_status("checkpointing", step=self.global_step)
        self._awaiting.setdefault(self.global_step, []).extend(requests)
        try:
            self._write(blocking=not self.config.async_save)
        except FerryError as exc:
            self._failed(self.global_step, exc)

    def _failed(self, step: int, exc: Exception) -> None:
        """The save of ``step`` failed: say so, answer its requests, train on. Called on the
        training thread, or on the saver's when a background save fails."""
        log.error("ferry: checkpoint failed: %s", exc)
        self.job.event("checkpoint_failed", step=step, error=str(exc))
        for r in self._awaiting.pop(step, []):
            self.inbox.respond(r.id, ok=False, error=str(exc))
        if not self._stopping:
            self.job.update_status("running", step=self.global_step)

    def _write(self, blocking: bool) -> CheckpointInfo | None:
        """Save the tree: in the background when allowed; a multi-rank save is collective and
        therefore made here, on the training thread, by every rank."""
        extra = self.extra_files() if self.extra_files else None
        if self.group is not None:
            tree = self._tree()  # discovers first, in zero-code mode
            shards, _ = sharded.split(self.objects)
            info = save_ranked(
                self.config.dir,
                self.group,
                tree,
                step=self.global_step,
                meta=self._meta(),
                keep_last=self.config.keep_last,
                keep_every=self.config.keep_every,
                shards=shards,
            )
            self._committed(info)
            return info
        handle = self.saver.save(
            self._tree(), step=self.global_step, meta=self._meta(), extra_files=extra, blocking=blocking
        )
        return handle.result() if blocking else None

    def _stop(self, requests: list[Request]) -> None:
        self._stopping = True
        signame = self.signals.stop_signal
        if signame is not None:
            why = signal.Signals(signame).name
        elif requests:
            why = "a stop request"
        else:
            why = "a stop asked of another rank"
        log.info("ferry: stopping at step %d on %s: saving a checkpoint first", self.global_step, why)
        self.job.update_status("checkpointing", step=self.global_step)
        try:
            try:
                self.saver.wait()
            except FerryError as exc:
                log.warning("ferry: the previous checkpoint had failed: %s", exc)
            self._awaiting.setdefault(self.global_step, []).extend(requests)
            self._last_step = self.global_step
            info = self._write(blocking=True)
            assert info is not None
        except Exception as exc:  # whatever went wrong, the job must say so and exit distinctly
            code = self.config.failure_exit_code
            log.error(
                "ferry: could not commit a checkpoint before stopping (%s); exiting with %d, "
                "the last good checkpoint is untouched",
                exc,
                code,
            )
            for r in requests:
                self.inbox.respond(r.id, ok=False, error=str(exc))
            self.job.update_status("failed", step=self.global_step, error=str(exc), exit_code=code)
            self.close()
            raise SystemExit(code) from exc
        code = self.config.exit_code
        restart = next((r.env or {} for r in requests if r.action == "restart"), None)
        if restart is not None and self.config.handoff_dir and self.group is None:
            handoff.leave(self.config.handoff_dir, self._tree(), self.global_step)
        self.job.update_status(
            "checkpointed", step=self.global_step, exit_code=code, url=info.url, restart=restart
        )
        self.job.event("stop", step=self.global_step, url=info.url, exit_code=code)
        log.info("ferry: checkpointed at step %d, exiting with %d (resume me)", self.global_step, code)
        self.close()
        raise SystemExit(code)

    def _committed(self, info: CheckpointInfo) -> None:
        """Called on the persist thread once a checkpoint is committed."""
        log.info(
            "ferry: checkpoint step %d -> %s (%s, %.2f s, %.2f GB/s, training blocked %.3f s)",
            info.step,
            info.url,
            _size(info.nbytes),
            info.seconds,
            info.gbps,
            info.blocking_seconds,
        )
        entry = {
            "step": info.step,
            "url": info.url,
            "bytes": info.nbytes,
            "seconds": info.seconds,
            "blocking_seconds": info.blocking_seconds,
            "time": time.time(),
        }
        self.job.record_checkpoint(entry)
        if self.transfer is not None:
            self._push(info.url.rstrip("/").rsplit("/", 1)[-1], info.step)
        self.job.event("checkpoint", **entry)
        grace = self.config.grace_seconds
        if grace and info.seconds > 0.8 * grace:
            log.warning(
                "ferry: warning: a checkpoint took %.1f s, over 80%% of the %.0f s grace period; "
                "a stop may be killed before it commits: raise the grace period or save less state",
                info.seconds,
                grace,
            )
        advice = self.scheduler.grace_warning(info.seconds)
        if advice is not None and not self._warned_grace:
            self._warned_grace = True
            log.warning("%s", advice)
        for r in self._awaiting.pop(info.step, []):
            self.inbox.respond(r.id, ok=True, step=info.step, url=info.url, seconds=info.seconds)
        if not self._stopping:
            self.job.update_status("running", step=self.global_step)

    def _push(self, name: str, step: int) -> None:
        """Copy a committed checkpoint to the remote; the outcome lands in the job's events."""
        assert self.transfer is not None
        handle = self.transfer.push(name)

        def record(error: BaseException | None, url: str | None) -> None:
            retried = len(handle.failed)
            if error is None:
                self.job.event("remote_copy", step=step, url=url, retried=retried)
            else:
                self.job.event("remote_copy_failed", step=step, name=name, retried=retried, error=str(error))

        handle.on_done(record)

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Wait for the save in flight, put signal handlers and hooks back, release the job."""
        if self._closed:
            return
        self._closed = True
        try:
            self.saver.close()
        except FerryError as exc:
            log.error("ferry: the last checkpoint failed: %s", exc)
        if self.transfer is not None:
            self.transfer.close(self.config.grace_seconds)
        self.signals.uninstall()
        self.job.release_lock()
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_excepthook
        untrack_all()
        global _CURRENT
        if _CURRENT is self:
            _CURRENT = None

    def _excepthook(self, kind: type[BaseException], value: BaseException, tb: Any) -> None:
        """An uncaught exception ends the job as failed, not finished."""
        self.job.update_status("failed", step=self.global_step, error=f"{kind.__name__}: {value}")
        self.job.event("failed", step=self.global_step, error=f"{kind.__name__}: {value}")
        self._previous_excepthook(kind, value, tb)

    def _atexit(self) -> None:
        if not self._closed:
            self.close()
            if self.job.status().get("state") in ("running", "resumed", "checkpointing"):
                self.job.update_status("finished", step=self.global_step)


_CURRENT: Session | None = None


def current(create: bool = True) -> Session | None:
    """The session of this process (made from FERRY_* settings on first use)."""
    global _CURRENT
    if _CURRENT is None and create:
        _CURRENT = Session()
    return _CURRENT


def configure(**settings: Any) -> Session:
    """Start the session with these settings (see ``ferry.Config``); call before ``track``."""
    global _CURRENT
    if _CURRENT is not None:
        raise FerryError(
            "ferry is already configured in this process; call ferry.configure() before ferry.track(), once"
        )
    _CURRENT = Session(Config.from_env(**settings))
    return _CURRENT


def _session() -> Session:
    session = current()
    assert session is not None
    return session


def track(**objects: Any) -> None:
    """Track training state by name; see ``Session.track``."""
    _session().track(**objects)


def step() -> None:
    """Mark a safe point between iterations (needed only without a tracked DataLoader)."""
    _session().step()


def restore() -> int | None:
    """Restore the newest checkpoint now; returns its step, or None when starting fresh."""
    return _session().restore()


def checkpoint(stop: bool = False) -> None:
    """Request a checkpoint (and a stop, with ``stop=True``) at the next safe point."""
    _session().request("stop" if stop else "checkpoint")


def close() -> None:
    """Finish the session: wait for the last save, put handlers back."""
    session = current(create=False)
    if session is not None:
        session.close()
