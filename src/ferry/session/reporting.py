"""What the session tells the world: its log lines, the job folder's status and events, and
the answers to control requests; what a save tells (its commit, the copy to the remote) is
``savereport``'s."""

from __future__ import annotations

import logging
import signal
from typing import Any

from ferry.config import Config
from ferry.engine import CheckpointInfo
from ferry.runtime.control import ControlInbox, Request
from ferry.runtime.jobdir import JobDir
from ferry.runtime.launch import under_ferry_agent
from ferry.session.policy import stop_exit_code
from ferry.session.savereport import SaveReport

log = logging.getLogger("ferry")


class Reporter:
    """What the session tells the world; what a save tells is ``saves``'s."""

    def __init__(self, config: Config, job: JobDir, inbox: ControlInbox, saves: SaveReport) -> None:
        self.config, self.job, self.inbox = config, job, inbox
        self.saves = saves
        self._replaced: set[tuple[str, str]] = set()

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
        code = self._exit_code(committed=False)
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
        code = self.config.exit_code  # the job's status: what `ferry run` exits with
        self.job.update_status("checkpointed", step=info.step, exit_code=code, url=info.url, restart=restart)
        self.job.event("stop", step=info.step, url=info.url, exit_code=code)
        exits = self._exit_code(committed=True)
        if exits != code:
            log.info(
                "ferry: checkpointed at step %d; exiting with 0 for torchrun (ferry run exits %d: resume me)",
                info.step,
                code,
            )
            return exits
        log.info("ferry: checkpointed at step %d, exiting with %d (resume me)", info.step, code)
        return code

    def _exit_code(self, *, committed: bool) -> int:
        return stop_exit_code(
            committed=committed,
            exit_code=self.config.exit_code,
            failure_exit_code=self.config.failure_exit_code,
            under_agent=under_ferry_agent(),
        )

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
        """This rank cannot go on with the job: it ends now (``startup.Relay.fatal``)."""
        self.job.update_status("failed", step=step, error=why)
        self.job.event("failed", step=step, error=why)

    def finished(self, step: int) -> None:
        if self.job.status().get("state") in ("running", "resumed", "checkpointing"):
            self.job.update_status("finished", step=step)
