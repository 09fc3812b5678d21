"""A session's start-up: everything ``Session.start`` does before the session exists, in
order: a warm worker's wait to take over, ferry's log lines, the checkpointer, the job
folder (its identity and lock), the control inbox, the signal handlers, the fetch from the
remote, the reporter, the checkpoint to resume, the job's first status and the thread that
watches saves. ``Parts`` holds what it built, for ``Session.__init__`` to keep."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ferry.config import Config
from ferry.engine import CheckpointInfo
from ferry.engine.transfer import Transfer, TransferPolicy
from ferry.errors import FerryError, bug
from ferry.progress import Tally
from ferry.runtime.control import ControlInbox
from ferry.runtime.distributed import end_rank, speaks_for_node
from ferry.runtime.identity import default_job_id
from ferry.runtime.jobdir import JobDir
from ferry.runtime.procs import own_process
from ferry.runtime.signals import SignalRequests
from ferry.schedulers import detect as detect_scheduler
from ferry.session import checkpointer as checkpointer_module
from ferry.session import resume, warm
from ferry.session.checkpointer import Checkpointer
from ferry.session.reporting import Reporter
from ferry.session.savereport import Progress, SaveReport
from ferry.session.savewatch import SaveWatch

log = logging.getLogger("ferry")


@dataclass(frozen=True, kw_only=True)
class Parts:
    """What a started session is made of (``open_parts``)."""

    config: Config
    started: float
    """time.monotonic() once the session may start (a warm worker: after its wait)."""
    job_id: str
    job: JobDir
    inbox: ControlInbox
    signals: SignalRequests
    checkpointer: Checkpointer
    report: Reporter
    transfer: Transfer | None
    found: resume.Resume | None
    """The checkpoint to resume, if any."""
    save_watch: SaveWatch | None
    relay: Relay


class Relay:
    """The checkpointer is built before the reporter and the session: its callbacks (a save
    writes, commits, fails, or this rank cannot go on) come through here, and so does the
    reporter's view of the session's progress, bound once they exist (``Session.start``)."""

    def __init__(self) -> None:
        self.report: Reporter | None = None
        self.progress: Progress | None = None

    @property
    def global_step(self) -> int:
        return 0 if self.progress is None else self.progress.global_step

    @property
    def stopping(self) -> bool:
        return self.progress is not None and self.progress.stopping

    def _report(self) -> Reporter:
        if self.report is None:
            raise bug("a save reported before the session's reporter exists")
        return self.report

    def writing(self, step: int) -> None:
        # The job's status says "checkpointing" once a save writes, from the writing thread:
        # a status rewrite took milliseconds of the training thread at each save.
        self._report().saves.writing(step)

    def committed(self, info: CheckpointInfo) -> None:
        self._report().saves.committed(info)

    def failed(self, step: int, exc: Exception) -> None:
        self._report().saves.failed(step, exc)

    def fatal(self, why: str, code: int) -> None:
        """This rank cannot go on with the job (a stalled peer, a root the nodes do not
        share): the job's records say why, and the process ends now (from any thread)."""
        if self.report is not None:
            self.report.fatal(self.global_step, why)
        end_rank(why, code)


def open_parts(config: Config | None, signals: SignalRequests | None) -> Parts:
    """Start a session up (the module's docstring says what, in order)."""
    config = config or Config.from_env()
    # A warm worker (docs/jobs.md, "Warm migration") waits here, before it looks at the job
    # or writes anything of it, until the worker it replaces has handed its state over.
    warm_wait = warm.wait_for_takeover(config.stop_signals)
    default_logging()
    if warm_wait is not None:
        log.info("ferry: taking over, after %.1f s at the restore point (a warm migration)", warm_wait)
    started = time.monotonic()
    job_id = config.job_id or os.environ.get("FERRY_JOB_ID") or default_job_id()
    relay = Relay()
    tally = Tally(on_begin=relay.writing)
    checkpointer = checkpointer_module.for_process(config, relay.committed, relay.failed, tally, relay.fatal)
    job = _open_job(config, job_id, checkpointer)
    inbox = ControlInbox(job)
    if signals is None:  # zero-code mode hands over the handlers armed at start-up
        signals = SignalRequests(config.stop_signals, config.checkpoint_signals)
        signals.install()
    transfer: Transfer | None = None  # docs/transfer.md
    if config.remote and checkpointer.reports_for_job:
        transfer = Transfer(config.dir, TransferPolicy(remote=config.remote))
        if config.resume:
            transfer.fetch_if_missing()
    # its scheduler's grace period is checked after each commit
    saves = SaveReport(config, job, inbox, detect_scheduler(), transfer, relay)
    relay.report = report = Reporter(config, job, inbox, saves)
    found = _find(config, checkpointer, job, job_id)
    job.update_status("running", step=0, pid=os.getpid())
    # last: a session that failed to start leaves no thread behind
    save_watch = SaveWatch(job, tally) if job.writer else None
    return Parts(
        config=config,
        started=started,
        job_id=job_id,
        job=job,
        inbox=inbox,
        signals=signals,
        checkpointer=checkpointer,
        report=report,
        transfer=transfer,
        found=found,
        save_watch=save_watch,
        relay=relay,
    )


def _open_job(config: Config, job_id: str, checkpointer: Checkpointer) -> JobDir:
    """The job's folder, with this process's identity; locked unless `ferry run` holds it."""
    job = JobDir.create(job_id, config.job_dir)
    if not (checkpointer.reports_for_job or speaks_for_node(checkpointer.rank)):
        job.writer = False
        log.setLevel(logging.WARNING)  # rank 0 reports for the job, a node's first rank for its node
    job.write_identity(
        id=job_id, pid=os.getpid(), argv=[sys.executable, *sys.argv], checkpoint_dir=config.dir
    )
    if job.writer and "FERRY_SUPERVISOR_PID" not in os.environ:  # else `ferry run` holds it
        try:
            job.acquire_lock()
        except FerryError as exc:
            log.warning("ferry: %s", exc)
    return job


def _find(config: Config, checkpointer: Checkpointer, job: JobDir, job_id: str) -> resume.Resume | None:
    """The checkpoint to resume; starting fresh, the job says so where it must."""
    if not config.resume:
        return None
    found = resume.find(config.dir, checkpointer)
    if found is not None:
        found.allow_changed_inputs = config.allow_changed_inputs
        if job.writer:  # one rank speaks for the job
            found.check_command(sys.argv)
    elif job.writer:
        resume.starting_fresh(config.dir, job_id, [sys.executable, *sys.argv])
    return found


def register_exit(hook: Callable[[], None]) -> None:
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


def default_logging() -> None:
    """ferry's lines go to stderr unless the program configured logging itself."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
