"""What a save tells the world, from the thread that writes it or the training thread: the
job's status while it writes, the commit's log line, record and event, the copy of each
commit to the remote, the grace-period warnings, and the answers to the requests that wait
on it. ``reporting.Reporter`` holds one, as ``saves``."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from ferry.config import Config
from ferry.engine import CheckpointInfo
from ferry.engine.transfer import Superseded, Transfer
from ferry.errors import bug
from ferry.runtime.control import ControlInbox, Request
from ferry.runtime.grace import slow_save_warning
from ferry.runtime.jobdir import JobDir
from ferry.runtime.jobfiles import CheckpointRecord
from ferry.schedulers import SchedulerAdapter

log = logging.getLogger("ferry")


class Progress(Protocol):
    """The session as a report sees it: a commit may be reported from the saver's thread
    while training goes on, so these are read when the report is made."""

    @property
    def global_step(self) -> int: ...

    @property
    def stopping(self) -> bool: ...


def size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


class SaveReport:
    def __init__(
        self,
        config: Config,
        job: JobDir,
        inbox: ControlInbox,
        scheduler: SchedulerAdapter,
        transfer: Transfer | None,
        progress: Progress,
    ) -> None:
        self.config, self.job, self.inbox = config, job, inbox
        self.scheduler, self.transfer, self.progress = scheduler, transfer, progress
        self._awaiting: dict[int, list[Request]] = {}
        self._warned_grace = False

    def awaiting(self, step: int, requests: list[Request]) -> None:
        """These requests are answered once the save of ``step`` commits or fails."""
        self._awaiting.setdefault(step, []).extend(requests)

    def writing(self, step: int) -> None:
        """The save of ``step`` began writing (told on the writing thread): the job's status
        says "checkpointing" until it commits or fails."""
        try:
            self.job.update_status("checkpointing", step=step)
        except OSError as exc:  # a full disk: the save's own error will say more
            log.warning("ferry: the job's status does not show the save of step %d: %s", step, exc)

    def committed(self, info: CheckpointInfo) -> None:
        """Called on the persist thread once a checkpoint is committed."""
        log.info(
            "ferry: checkpoint step %d -> %s (%s, %.2f s, %.2f GB/s, training blocked %.3f s)",
            info.step,
            info.url,
            size(info.nbytes),
            info.seconds,
            info.gbps,
            info.blocking_seconds,
        )
        entry: CheckpointRecord = {
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
        self.job.event(
            "checkpoint",
            step=info.step,
            url=info.url,
            bytes=info.nbytes,
            seconds=info.seconds,
            blocking_seconds=info.blocking_seconds,
        )
        self._warn_grace(info.seconds)
        for r in self._awaiting.pop(info.step, []):
            self.inbox.respond(r.id, ok=True, step=info.step, url=info.url, seconds=info.seconds)
        if not self.progress.stopping:
            self.job.update_status("running", step=self.progress.global_step)

    def failed(self, step: int, exc: Exception) -> None:
        """The save of ``step`` failed: say so, answer its requests, train on. Called on the
        training thread, or on the saver's when a background save fails."""
        log.error("ferry: checkpoint failed: %s", exc)
        self.job.event("checkpoint_failed", step=step, error=str(exc))
        for r in self._awaiting.pop(step, []):
            self.inbox.respond(r.id, ok=False, error=str(exc))
        if not self.progress.stopping:
            self.job.update_status("running", step=self.progress.global_step)

    def _warn_grace(self, seconds: float) -> None:
        warning = slow_save_warning(seconds, self.config.grace_seconds)
        if warning is not None:
            log.warning("%s", warning)
        advice = self.scheduler.grace_warning(seconds)
        if advice is not None and not self._warned_grace:
            self._warned_grace = True
            log.warning("%s", advice)

    def _push(self, name: str, step: int) -> None:
        """Copy a committed checkpoint to the remote; the outcome lands in the job's events."""
        if self.transfer is None:
            raise bug("a push without a transfer")
        # Each retry is recorded as it happens: a worker killed mid-copy still leaves them.
        handle = self.transfer.push(name, lambda what: self.job.event("remote_retry", step=step, error=what))

        def record(error: BaseException | None, url: str | None) -> None:
            retried = len(handle.failed)
            if error is None:
                self.job.event("remote_copy", step=step, url=url, retried=retried)
            elif isinstance(error, Superseded):
                self.job.event("remote_copy_skipped", step=step, name=name, reason=str(error))
            else:
                self.job.event("remote_copy_failed", step=step, name=name, retried=retried, error=str(error))

        handle.on_done(record)
