"""Asynchronous save: block only for the snapshot, persist on one background thread.

At most one save is in flight. A second ``save`` waits for the first (and raises its
error, if it failed), so host memory never holds more than one snapshot. With ``on_error``,
a background save's failure is reported there, from the background thread, as soon as it
happens, and neither the next ``save`` nor ``wait`` raises it again.

A save may also have a ``mirror``: a second writer of the same snapshot (a copy in host memory
for the process that takes over from this one, ``ferry.runtime.handoff``), run on a thread of
its own while the checkpoint is written, so that the copy costs no second snapshot and its
write overlaps the durable one. The save is done when both are; the mirror's failure is the
mirror's own to report (it is never the checkpoint's).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from ferry.engine.catalog import apply_retention
from ferry.engine.codec import Flattened, flatten
from ferry.engine.deferred import Deferred, OverlapBroken
from ferry.engine.gcpause import paused_gc
from ferry.engine.persist import CheckpointInfo, check_step, persist
from ferry.engine.snapshot import HostBuffer, byte_view, snapshot
from ferry.errors import UnsupportedStateError
from ferry.progress import Tally, counting
from ferry.storage import Storage, open_storage

log = logging.getLogger("ferry")

Mirror = Callable[[Flattened, memoryview, int], None]
"""Writes a second copy of a snapshot: (its tensors, its bytes, its step)."""


def _frozen(meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """A copy of ``meta`` as it is now (the caller may change it while the save runs); its
    error, if it is no JSON, comes here rather than from the background thread."""
    if meta is None:
        return None
    try:
        frozen: dict[str, Any] = json.loads(json.dumps(meta))
    except (TypeError, ValueError) as exc:
        raise UnsupportedStateError(f"checkpoint meta must be plain JSON values: {exc}") from exc
    return frozen


class Stall:
    """What one save cost the thread that asked for it, in seconds: from ``since`` (when it
    stopped for the save: a session's safe point, discovery and capture included) until
    the save returned to it, plus what the next optimizer step waited for the copies the
    snapshot left running (``overlap_snapshot``). A blocking save's caller waits for the
    commit: the whole save is its stall.

    The saving thread calls ``returned`` as the save hands back; the persisting thread
    reads ``seconds`` once the checkpoint is committed (a commit is never faster than the
    few statements between the two, so it does not wait in practice)."""

    def __init__(self, since: float, blocking: bool) -> None:
        self.since, self.blocking = since, blocking
        self._back = threading.Event()
        self._seconds = 0.0

    def returned(self) -> None:
        self._seconds = time.perf_counter() - self.since
        self._back.set()

    def seconds(self, deferred: Deferred | None) -> float:
        if self.blocking:
            return time.perf_counter() - self.since
        self._back.wait()
        return self._seconds + (0.0 if deferred is None else deferred.waited)


class SaveHandle:
    """The result of an asynchronous save."""

    def __init__(self, future: Future[CheckpointInfo], step: int, reported: threading.Event) -> None:
        self._future = future
        self.step = step
        self.reported = reported
        """Set once its failure was handed to the saver's ``on_error``."""

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> CheckpointInfo:
        """Block until committed; raises the save's error if it failed."""
        return self._future.result(timeout)

    def result(self) -> CheckpointInfo:
        return self._future.result()


class InflightSaves:
    """What every background saver has: one host buffer reused from save to save, one
    persisting thread, at most one save in flight, and how to wait for it and close."""

    def __init__(self, thread_name: str) -> None:
        self._buffer = HostBuffer()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=thread_name)
        self._inflight: SaveHandle | None = None
        self._lock = threading.Lock()
        """Guards ``_inflight`` where saves may come from more than one thread."""
        self.deferred: Deferred | None = None
        """The copies the last snapshot left running (``overlap_snapshot``), if any."""

    def copied(self) -> OverlapBroken | None:
        """On the training thread, before anything changes the deferred tensors (an
        optimizer step): wait until the last snapshot's copies are done. Returns the broken
        contract (``ferry.engine.deferred``), which also fails that save."""
        deferred = self.deferred
        failed = None if deferred is None else deferred.wait(training=True)
        return failed if isinstance(failed, OverlapBroken) else None  # the save reports the rest

    def deferred_snapshot(
        self, flat: Flattened, defer: Mapping[int, object] | None
    ) -> tuple[torch.Tensor, int, Deferred | None]:
        """``snapshot`` into the reused buffer; the copies it leaves running are the ones
        ``copied`` waits for from now on."""
        host, size, self.deferred = snapshot(flat, self._buffer, defer)
        return host, size, self.deferred

    def _start(self, work: Callable[[], CheckpointInfo], step: int, reported: threading.Event) -> SaveHandle:
        """Run ``work`` on the persisting thread: the save in flight from now on."""
        handle = SaveHandle(self._pool.submit(work), step, reported)
        self._inflight = handle
        return handle

    def _settle(self, handle: SaveHandle) -> None:
        """A blocking save: wait for ``handle`` and raise its error. Its caller then has the
        outcome, so the next save must not raise it again: it is no longer in flight."""
        try:
            handle.wait()
        finally:
            with self._lock:
                if self._inflight is handle:
                    self._inflight = None

    def busy(self) -> bool:
        """A save is in flight: the next ``save`` would wait for it."""
        handle = self._inflight
        return handle is not None and not handle.done()

    def wait(self) -> CheckpointInfo | None:
        """Wait for the save in flight, if any; raises its error (unless ``on_error`` had it)."""
        handle, self._inflight = self._inflight, None
        if handle is None:
            return None
        try:
            return handle.wait()
        except Exception:
            if handle.reported.is_set():
                return None
            raise

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
            self._buffer.release()


class AsyncSaver(InflightSaves):
    """Saves to one checkpoint root; reuses its host buffer from save to save."""

    def __init__(self, url: str, *, keep_last: int | None = 3, keep_every: int | None = None,
                 on_commit: Callable[[CheckpointInfo], None] | None = None,
                 on_error: Callable[[int, Exception], None] | None = None,
                 tally: Tally | None = None) -> None:  # fmt: skip
        """``tally``: counts the bytes of the save in flight, for the job's status."""
        self.url = url
        self.tally = tally
        self.storage: Storage = open_storage(url)
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.on_commit = on_commit
        self.on_error = on_error
        super().__init__("ferry-persist")

    def save(self, state: Any, *, step: int, meta: dict[str, Any] | None = None,
             extra_files: dict[str, bytes] | None = None, blocking: bool = False,
             mirror: Mirror | None = None,
             defer: Mapping[int, object] | None = None,
             since: float | None = None) -> SaveHandle:  # fmt: skip
        """Snapshot ``state`` now, persist it in the background. ``blocking=True`` waits.
        ``mirror`` writes a second copy of the same snapshot meanwhile (module docstring).
        ``defer``: tensors whose copies may go on after this returns (``snapshot``; not with
        ``blocking`` or a ``mirror``); the caller calls ``copied`` before changing them.
        ``since``: ``time.perf_counter()`` when the caller stopped for this save (a safe
        point's entry): the time it blocked counts from there (``Stall``), and so does the
        save's time, less any wait for the previous save; by default from this call."""
        check_step(step)
        meta, extra_files = _frozen(meta), {k: bytes(v) for k, v in (extra_files or {}).items()}
        with self._lock:
            t0 = time.perf_counter() if since is None else since
            before = time.perf_counter()
            self.wait()  # surfaces the previous save's error, frees the buffer
            start = t0 + time.perf_counter() - before  # the previous save's time is not this one's
            with paused_gc():
                flat = flatten(state)
                later = None if blocking or mirror is not None else defer
                host, size, deferred = self.deferred_snapshot(flat, later)
            stall = Stall(t0, blocking)
            view = byte_view(host)
            # A blocking save's error goes to its caller; a background one's to on_error.
            report = None if blocking else self.on_error
            reported = threading.Event()

            def work() -> CheckpointInfo:
                total = size + sum(len(blob) for blob in extra_files.values())
                copy = None if mirror is None else _start_mirror(mirror, flat, view, step)
                try:
                    if deferred is not None:
                        deferred.check()
                    with counting(self.tally, step, total):
                        name = persist(self.storage, flat, view, step, meta=meta, extra_files=extra_files)
                    if self.keep_last:
                        apply_retention(self.storage, self.keep_last, self.keep_every)
                    # The checkpoint's own time: the mirror's wait below is not its.
                    info = CheckpointInfo(self.storage.child_url(name), step, size,
                                          time.perf_counter() - start, stall.seconds(deferred))  # fmt: skip
                except Exception as exc:
                    if report is not None:
                        report(step, exc)
                        reported.set()
                    raise
                finally:
                    if copy is not None:
                        copy.join()  # the buffer is the next save's once both are written
                if self.on_commit is not None:
                    self.on_commit(info)
                return info

            handle = self._start(work, step, reported)
            stall.returned()
        if blocking:
            self._settle(handle)
        return handle


def _start_mirror(mirror: Mirror, flat: Flattened, view: memoryview, step: int) -> threading.Thread:
    def run() -> None:
        try:
            mirror(flat, view, step)
        except Exception as exc:  # the mirror reports its own failures; this is a last guard
            log.warning("ferry: the second copy of step %d was not written: %s", step, exc)

    thread = threading.Thread(target=run, name="ferry-mirror", daemon=True)
    thread.start()
    return thread
