"""Transfer policies: checkpoint to a fast local path, copy to a remote root, fetch it back.

What HTC sites do: the job writes its checkpoints to node-local disk (fast, and the commit
is a local rename), and each committed checkpoint is then copied to a remote root (a
shared filesystem path, ``s3://``, ``root://``) in the background. On another node, where
the local folder is empty, the restore fetches the newest committed checkpoint from the
remote first. Writing to the remote directly needs no policy: give it as the checkpoint
folder (``ferry run --dir s3://...``).

A copy is a commit transaction (``ferry.storage.transaction``) on the destination, in this
order: data files (each checked against the manifest's xxh3 checksum while it streams),
the manifest, then the commit through the destination's own strategy (a rename, or the
``COMMITTED`` marker on object stores). Every step is retried
with exponential backoff; when the retries run out the copy fails with a ``TransferError``
that says so, the local checkpoint is kept, and the remote never lists the checkpoint as
committed: readers skip a folder without its commit.

A user callback replaces the built-in copy in both directions: ``callback("push",
checkpoint_url, remote_root)`` after each local commit and ``callback("fetch",
remote_root, local_root)`` before a restore that found nothing locally.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from ferry.engine.catalog import apply_retention, held, list_checkpoints
from ferry.errors import ConfigError, StorageError
from ferry.format.manifest import FileEntry, decode_manifest
from ferry.knobs import backoff_delay
from ferry.progress import Meter, meter_for
from ferry.storage import FileRecord, Storage, Transaction, open_storage, strategy_for
from ferry.storage.atomic import MANIFEST

log = logging.getLogger("ferry")

T = TypeVar("T")
TransferCallback = Callable[[str, str, str], None]
"""``(direction, source URL, destination root URL)``; direction is ``push`` or ``fetch``."""
MODES = ("background", "sync")


class TransferError(StorageError):
    """A copy to or from the remote failed after its retries; the source is untouched."""


class SourceGone(TransferError):
    """The checkpoint to copy is no longer committed where it was (removed meanwhile): no
    retry brings it back."""


class Superseded(TransferError):
    """A copy that had not started yet when a newer checkpoint's copy was asked for: the
    remote gets the newer one instead."""


def _manifest_of(src: Storage, name: str) -> bytes:
    """The manifest of the committed checkpoint ``name`` under ``src``."""
    try:
        committed = strategy_for(src).is_committed(src, name)
    except FileNotFoundError:
        committed = False
    if not committed:
        raise SourceGone(f"{src.child_url(name)} is no longer a committed checkpoint (removed meanwhile)")
    return src.read_bytes(f"{name}/{MANIFEST}")


@dataclass(kw_only=True)
class TransferPolicy:
    """Where committed checkpoints are copied, and how hard ferry tries."""

    remote: str
    """The remote root: a shared filesystem path or an fsspec URL (``s3://``, ``root://``)."""
    mode: str = "background"
    """``background``: the copy runs on its own thread while training goes on (a stop
    waits for it); ``sync``: the commit returns only once the remote has it too."""
    retries: int = 5
    """Retries of each step of a copy (a file, the manifest, the commit)."""
    backoff_seconds: float = 0.5
    """Wait before the n-th retry: this times 2**(n-1), at most ``backoff_cap_seconds``."""
    backoff_cap_seconds: float = 10.0
    """The longest wait between two tries."""
    keep_last: int | None = None
    """Committed checkpoints to keep on the remote (None: all)."""
    callback: TransferCallback | None = None
    """Replaces the built-in copy, both ways (see the module's docstring)."""
    storage_options: dict[str, Any] = field(default_factory=dict)
    """Options for the remote's fsspec filesystem (endpoint, credentials)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"transfer mode {self.mode!r}: use one of {', '.join(MODES)}")
        if self.retries < 0 or self.backoff_seconds < 0:
            raise ConfigError("transfer retries and backoff_seconds must be >= 0")
        if self.keep_last is not None and self.keep_last < 1:
            raise ConfigError(f"keep_last must be >= 1 on the remote too, got {self.keep_last}")


Retried = Callable[[str], None]
"""Told of each failed try that is retried, as it fails: what failed, and why."""


def retry(what: str, fn: Callable[[], T], policy: TransferPolicy, failed: Retried | None = None) -> T:
    """``fn()``, tried ``1 + policy.retries`` times with exponential backoff; each failed
    try that is retried is told to ``failed``. A source that is gone is not retried."""
    attempts = policy.retries + 1
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if isinstance(exc, SourceGone):
                raise TransferError(f"{what} failed, not to be retried: {exc}") from exc
            if attempt == attempts:
                raise TransferError(f"{what} failed {attempts} times, the last with: {exc}") from exc
            delay = backoff_delay(policy.backoff_seconds, attempt, policy.backoff_cap_seconds)
            log.warning(
                "ferry: transfer: %s failed (%s); retry %d of %d in %.1f s",
                what,
                exc,
                attempt,
                policy.retries,
                delay,
            )
            if failed is not None:
                failed(f"{what}: {exc}")
            time.sleep(delay)
    raise AssertionError("unreachable")


def copy_checkpoint(
    src: Storage,
    name: str,
    dst: Storage,
    policy: TransferPolicy,
    failed: Retried | None = None,
    meter: Meter | None = None,
) -> str:
    """Copy the committed checkpoint ``name`` from root ``src`` to root ``dst`` as one commit
    transaction there: data, manifest, commit, each step retried (the tries retried are
    told to ``failed``). Returns its URL under ``dst``. Idempotent. ``meter`` follows
    the bytes read (a retried file counts again)."""
    target = dst.child_url(name)
    if retry(f"looking for {target}", lambda: strategy_for(dst).is_committed(dst, name), policy, failed):
        return target
    raw = retry(f"reading {src.child_url(name)}", partial(_manifest_of, src, name), policy, failed)
    files = decode_manifest(raw, src.child_url(name))["files"]
    if meter is not None:
        meter.start(f"copying {name}", sum(meta["size"] for meta in files.values()))
    try:
        _copy_files(src, name, dst, files, policy, failed, meter, raw)
    finally:
        if meter is not None:
            meter.finish()
    return target


def _copy_files(
    src: Storage,
    name: str,
    dst: Storage,
    files: dict[str, FileEntry],
    policy: TransferPolicy,
    failed: Retried | None,
    meter: Meter | None,
    raw: bytes,
) -> None:
    target = dst.child_url(name)
    begin = partial(Transaction.begin, dst, name)
    counted = None if meter is None else meter.advance
    with retry(f"creating a staging folder for {target}", begin, policy, failed) as txn:
        for rel, meta in files.items():
            expect = FileRecord(meta["size"], meta["xxh3_64"])
            copy = partial(txn.add_copy, src, f"{name}/{rel}", rel, expect, counted=counted)
            retry(f"copying {rel} to {target}", copy, policy, failed)
        # Before the commit: every file is there, whole. A remote that lost some of them while
        # it was down (a restarted server) must not get a commit over a partial checkpoint.
        missing = retry(f"checking the files copied to {target}", txn.missing, policy, failed)
        if missing:
            raise TransferError(
                f"{target}: {', '.join(missing)} went missing on the remote during the copy; not "
                "committed (the next checkpoint copies again)"
            )
        retry(f"committing {target}", partial(txn.commit, raw), policy, failed)


class TransferHandle:
    """One copy in flight: ``done()``, ``wait()``, ``result()`` (its URL, or its error)."""

    def __init__(self, future: Future[str], failed: list[str]) -> None:
        self._future = future
        self.failed = failed
        """The tries that failed and were retried, so far."""

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> bool:
        try:
            self._future.exception(timeout)
        except TimeoutError:
            return False
        return True

    def result(self, timeout: float | None = None) -> str:
        return self._future.result(timeout)

    def on_done(self, fn: Callable[[BaseException | None, str | None], None]) -> None:
        """Call ``fn(error, url)`` once the copy ended (now, when it already has), from the
        thread that ended it; ``failed`` then holds every try that was retried. A copy
        skipped for a newer one ends with ``Superseded``."""

        def call(future: Future[str]) -> None:
            if future.cancelled():
                fn(TransferError("not started: the job ended first"), None)
            elif (error := future.exception()) is not None:
                fn(error, None)
            else:
                fn(None, future.result())

        self._future.add_done_callback(call)


class Transfer:
    """A local checkpoint root paired with its remote, under one policy.

    Copies run one at a time, oldest first. When checkpoints are committed faster than the
    remote takes them, a copy that has not started by the time a newer one is asked for is
    skipped (``Superseded``): the remote gets the newest, and the queue never grows. The
    checkpoint being copied is ``held`` against local retention until its copy ends."""

    def __init__(self, local: str, policy: TransferPolicy) -> None:
        self.local_url = local
        self.policy = policy
        self.local = open_storage(local)
        self.remote = open_storage(policy.remote, **policy.storage_options)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ferry-transfer")
        self._pending: list[TransferHandle] = []
        self._lock = threading.Lock()
        self._newest = ""
        """The checkpoint of the newest copy asked for."""

    # ------------------------------------------------------------------ push
    def push(self, name: str, on_retry: Retried | None = None) -> TransferHandle:
        """Copy the committed local checkpoint ``name`` to the remote, in the background
        (``sync`` mode: before returning). Failures are logged and kept in the handle;
        ``on_retry`` is told of each failed try that is retried, as it fails."""
        failed: list[str] = []

        def note(what: str) -> None:
            failed.append(what)
            if on_retry is not None:
                on_retry(what)

        with self._lock:
            self._newest = name
            handle = TransferHandle(self._pool.submit(self._push, name, note), failed)
            self._pending = [h for h in self._pending if not h.done()] + [handle]
        if self.policy.mode == "sync":
            handle.wait()
        return handle

    def _push(self, name: str, failed: Retried) -> str:
        with self._lock:
            newer = self._newest if self._newest != name else None
        if newer is not None:
            log.info("ferry: checkpoint %s is not copied to %s: %s is newer", name, self.remote.url, newer)
            raise Superseded(f"skipped: {newer} was committed before this copy could start")
        started = time.monotonic()
        try:
            with held(self.local, name):
                url = self._copy(name, failed)
        except Exception as exc:
            log.error("ferry: could not copy checkpoint %s to %s: %s. %s", name, self.remote.url, exc,
                      self._after_failure(name, exc))  # fmt: skip
            raise
        log.info("ferry: checkpoint %s copied to %s (%.2f s)", name, url, time.monotonic() - started)
        if self.policy.keep_last is not None:
            apply_retention(self.remote, self.policy.keep_last)
        return url

    def _copy(self, name: str, failed: Retried) -> str:
        callback = self.policy.callback
        if callback is None:
            return copy_checkpoint(self.local, name, self.remote, self.policy, failed)
        src_url, root = self.local.child_url(name), self.remote.url
        push = partial(callback, "push", src_url, root)
        retry(f"the push callback for {src_url}", push, self.policy, failed)
        return self.remote.child_url(name)

    def _after_failure(self, name: str, exc: Exception) -> str:
        """What a failed copy left behind, as it is now: the next step for the user."""
        gone = isinstance(exc.__cause__, SourceGone) or isinstance(exc, SourceGone)
        if gone:
            return "The next checkpoint's copy goes on"
        return (
            f"The local copy {self.local.child_url(name)} is kept; the remote shows no partial "
            f"checkpoint. Check that {self.remote.url} is reachable: the next checkpoint tries again"
        )

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for every copy in flight; False when ``timeout`` ran out first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            pending = list(self._pending)
        for handle in pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not handle.wait(left):
                return False
        return True

    def close(self, timeout: float | None = None) -> None:
        if not self.wait(timeout):
            log.error(
                "ferry: a checkpoint copy to %s did not finish in time; the local copy is kept",
                self.remote.url,
            )
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ fetch
    def fetch_if_missing(self) -> str | None:
        """No committed checkpoint locally (a new node): fetch the newest from the remote.
        Returns the local URL fetched to, or None when there was a local one or none at all."""
        if list_checkpoints(self.local):
            return None
        callback = self.policy.callback
        if callback is not None:
            remote, local = self.remote.url, self.local.url
            retry(f"the fetch callback from {remote}", lambda: callback("fetch", remote, local), self.policy)
            found = list_checkpoints(self.local)
            return found[-1].url if found else None
        refs = retry(f"listing {self.remote.url}", lambda: list_checkpoints(self.remote), self.policy)
        if not refs:
            return None
        newest = refs[-1]
        self.local.makedirs("")
        t0 = time.monotonic()
        url = copy_checkpoint(
            self.remote, newest.name, self.local, self.policy, meter=meter_for(as_json=False)
        )
        log.info(
            "ferry: no local checkpoint; fetched %s from %s (%.1f s)",
            newest.name,
            self.remote.url,
            time.monotonic() - t0,
        )
        return url
