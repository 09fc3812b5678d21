"""What the session tells the world: its log lines, the job folder's status and events, the
answers to control requests, and the copy of each commit to the remote."""

from __future__ import annotations

import logging
import signal
import time
from typing import Any, Protocol

from ferry.config import Config
from ferry.engine import CheckpointInfo
from ferry.engine.transfer import Superseded, Transfer
from ferry.errors import bug
from ferry.runtime.control import ControlInbox, Request
from ferry.runtime.grace import slow_save_warning
from ferry.runtime.jobdir import JobDir
from ferry.runtime.jobfiles import CheckpointRecord
from ferry.runtime.launch import rank_exit_code
from ferry.schedulers import SchedulerAdapter

log = logging.getLogger("ferry")


class Progress(Protocol):
    """The session as the reporter sees it: a commit may be reported from the saver's
    thread while training goes on, so these are read when the report is made."""

    global_step: int

    @property
    def stopping(self) -> bool: ...


def size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


class Reporter:
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
        self._replaced: set[tuple[str, str]] = set()
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

    def handler_replaced(self, signum: int, handler: Any) -> None:
        """Another handler took over one of ferry's signals; ferry put its own back first."""
        name = getattr(handler, "__qualname__", None) or type(handler).__name__
        module = getattr(handler, "__module__", None)
        what = signal.Signals(signum).name
        if (what, name) in self._replaced:
            return
        self._replaced.add((what, name))
        log.info(
            "ferry: %s%s replaced ferry's %s handler; ferry's runs first again: %s",
            f"{module}." if module else "",
            name,
            what,
            "it records the stop and checkpoints at the next safe point, and that handler runs "
            "for this signal only before the first one"
            if what in self.config.stop_signals
            else "it records the request, then runs that handler",
        )

    def dropped(self, step: int, requests: list[Request], why: str) -> None:
        """Checkpoint requests the session closes without serving: said, and answered."""
        log.warning(
            "ferry: warning: %d checkpoint request(s) were not served: %s (last step %d)",
            len(requests),
            why,
            step,
        )
        for r in requests:
            self.inbox.respond(r.id, ok=False, error=f"not served: {why}")

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

    # ------------------------------------------------------------------ the job's end
    def resumed(self, url: str, step: int, seconds: float) -> None:
        log.info("ferry: resumed from %s at step %d (restore %.2f s)", url, step, seconds)
        self.job.update_status("resumed", step=step, resumed_from=url)
        self.job.event("resume", step=step, url=url, seconds=seconds)

    def stopping(self, step: int, why: str) -> None:
        log.info("ferry: stopping at step %d on %s: saving a checkpoint first", step, why)
        self.job.update_status("checkpointing", step=step)

    def stop_failed(self, step: int, exc: Exception, requests: list[Request]) -> int:
        """The checkpoint of a stop did not commit; returns the exit code that says so."""
        code = self.config.failure_exit_code
        log.error(
            "ferry: could not commit a checkpoint before stopping (%s); exiting with %d, "
            "the last good checkpoint is untouched",
            exc,
            code,
        )
        for r in requests:
            self.inbox.respond(r.id, ok=False, error=str(exc))
        self.job.update_status("failed", step=step, error=str(exc), exit_code=code)
        return code

    def stopped(self, info: CheckpointInfo, restart: dict[str, str] | None) -> int:
        """The checkpoint of a stop committed; returns the exit code that asks for a resume."""
        code = self.config.exit_code
        self.job.update_status("checkpointed", step=info.step, exit_code=code, url=info.url, restart=restart)
        self.job.event("stop", step=info.step, url=info.url, exit_code=code)
        if rank_exit_code(code) != code:
            log.info(
                "ferry: checkpointed at step %d; exiting with 0 for torchrun (ferry run exits %d: resume me)",
                info.step,
                code,
            )
            return 0
        log.info("ferry: checkpointed at step %d, exiting with %d (resume me)", info.step, code)
        return code

    def stop_missed(self, signum: int, step: int) -> None:
        """A stop signal came, but the script ended without reaching a safe point after it."""
        name = signal.Signals(signum).name
        log.warning(
            "ferry: %s asked for a checkpoint and stop, but the script reached no safe point after "
            "it and ended at step %d without one; `ferry help zero-code` says which loops have safe points",
            name,
            step,
        )
        self.job.event("stop_missed", signal=name, step=step)

    def overtaken(self, info: CheckpointInfo) -> None:
        """Answer the requests that came in while the stop of ``info`` was saving: a checkpoint
        or a stop is what that commit already is (the job trains no further), so they join it;
        a restart cannot happen any more, so it is refused, saying why."""
        for r in self.inbox.poll():
            if r.action in ("checkpoint", "stop"):
                self.inbox.respond(r.id, ok=True, step=info.step, url=info.url, seconds=info.seconds)
            else:
                self.inbox.respond(
                    r.id,
                    ok=False,
                    error=f"the job stopped with a checkpoint at step {info.step} before it could "
                    f"{r.action}: start it again (`ferry run`, `ferry resume`), then ask again",
                )

    def crashed(self, step: int, kind: type[BaseException], value: BaseException) -> None:
        """An uncaught exception ends the job as failed, not finished."""
        self.job.update_status("failed", step=step, error=f"{kind.__name__}: {value}")
        self.job.event("failed", step=step, error=f"{kind.__name__}: {value}")

    def fatal(self, step: int, why: str) -> None:
        """This rank cannot go on with the job: it ends now (``Session._fatal``)."""
        self.job.update_status("failed", step=step, error=why)
        self.job.event("failed", step=step, error=why)

    def finished(self, step: int) -> None:
        if self.job.status().get("state") in ("running", "resumed", "checkpointing"):
            self.job.update_status("finished", step=step)
