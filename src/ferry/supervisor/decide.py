"""What ``ferry run`` does when its worker exits: a pure function of plain values.

* 0: finished; the supervisor exits 0.
* the checkpoint code (85): the worker committed a checkpoint and stopped. The supervisor
  exits with it too ("resume me"), after handing the job back to the scheduler when a stop
  signal asked for it, unless the stop was a ``restart`` control request and in-place
  restarts remain: then it starts the worker again with the request's env.
* anything else (86: the checkpoint at a stop failed; a crash; a signal ferry did not
  send): a failure. Restarted from the last checkpoint after a backoff while
  ``max_failures`` allows, else propagated (128 + N for signal N).

A stop signal the supervisor received decides against every restart: the scheduler (or the
operator) wants the job gone. The rules and the files are documented in docs/jobs.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ferry.knobs import BACKOFF_CAP_SECONDS, backoff_delay
from ferry.supervisor.options import RunOptions
from ferry.supervisor.stopping import StopProgress, signal_name, what_stays

ExitAction = Literal["finished", "checkpointed", "failed", "restart", "backoff"]


@dataclass(frozen=True, kw_only=True)
class WorkerExit:
    """What the supervisor knows when its worker has exited."""

    returncode: int
    """The Popen return code: the exit status, or -N for a death by signal N."""
    checkpointed: bool = False
    """The job's status says this worker committed a checkpoint and stopped (status.json,
    written after it started), whatever its exit status (torchrun's ranks exit 0 after a
    stop under ``ferry run``, so that the launcher reports no failure)."""
    error: str | None = None
    """The job's status says the worker failed, and why (written after it started)."""
    stop_signal: str | None = None
    """The first stop signal the supervisor received in its life (SIGTERM, ...), if any."""
    killed: bool = False
    """The supervisor SIGKILLed the worker at the end of a stop's grace period."""
    forwarded: frozenset[str] = frozenset()
    """Signals the supervisor sent to this worker (a death by one of them is no crash)."""
    restart: Mapping[str, object] | None = None
    """A pending ``restart`` control request's env (None as a value: unset), if any."""
    restarts: int = 0
    """In-place restarts done so far."""
    failures: int = 0
    """Failures restarted so far."""
    progress: StopProgress | None = None
    """What the job's status said when the worker was killed at the end of a grace period."""


@dataclass(frozen=True)
class ExitDecision:
    """What the supervisor does after its worker exited (``decide_exit``)."""

    action: ExitAction
    """finished, checkpointed, failed: the supervisor ends with ``code``; restart: start the
    worker again now, with ``env`` applied; backoff: start it again after ``delay``."""
    code: int = 0
    """The exit status; for a backoff, the one to end with if a stop signal comes meanwhile."""
    message: str = ""
    """What the supervisor logs and records: why it ends (for a backoff: why it ends when a
    stop signal interrupts the wait), or the restart it does."""
    hand_back: bool = False
    """Checkpointed on a stop signal: once the end is recorded, the scheduler may take the job
    back (SLURM requeues it) and pick the exit status (``after_checkpoint``)."""
    delay: float = 0.0
    """The backoff before the restart, in seconds."""
    env: Mapping[str, str | None] = field(default_factory=dict)
    """For an in-place restart: the variables to set (None: unset) from now on."""
    notes: tuple[tuple[int, str], ...] = ()
    """Log lines (level, text) that come before the outcome."""


def hand_over_now(
    *,
    state: object,
    restart: object,
    updated: float,
    worker_started: float,
    warm_env: Mapping[str, str],
    warm_ready: bool,
    stopping: bool,
    restarts: int,
    max_restarts: int,
) -> bool:
    """A warm migration: may the warm worker take over now, while the old one still exits?

    Yes once the job's status (``state``, ``restart``, ``updated``) says that the current
    worker (started at ``worker_started``) committed its checkpoint for the migration's restart
    (``restart`` is the warm worker's env): by then it has left its state in host memory and
    writes nothing of the job any more, only its interpreter's teardown is left, which can take
    longer than the rest of the migration. Never during a stop (``stopping``), nor when no
    in-place restart is left (the old worker's exit is then decided as usual)."""
    return (
        warm_ready
        and not stopping
        and restarts < max_restarts
        and state == "checkpointed"
        and updated >= worker_started
        and isinstance(restart, Mapping)
        and dict(restart) == dict(warm_env)
    )


def exit_status(returncode: int) -> int:
    """A Popen return code as a shell reports it: 128 + N for a death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def resume_hint(options: RunOptions, checkpoint_dir: str) -> str:
    """How to resume a stopped job: the command given for it (``ferry resume``'s), else the
    same command (its job id is the same: given, the scheduler's, or made of the working
    directory and the command line)."""
    if options.resume_command:
        return f"to resume, run: {options.resume_command}"
    if options.fresh:
        return "run the same command again, in the same folder and without --fresh, to resume"
    return "run the same command again, in the same folder, to resume"


def decide_exit(w: WorkerExit, o: RunOptions, checkpoint_dir: str) -> ExitDecision:
    """What the supervisor does after the exit ``w``, under options ``o`` (whose exit_code
    is already the scheduler's checkpoint code): a dispatch over the three cases (a stop
    signal came; the worker checkpointed; it failed)."""
    if w.returncode == 0 and not w.checkpointed:
        return ExitDecision("finished", 0, "the worker finished")
    case = _case(w, o, checkpoint_dir)
    if w.stop_signal is not None:  # the scheduler (or the operator) wants the job gone
        return _after_stop(case, w.stop_signal)
    if case.returncode == o.exit_code:
        return _after_checkpoint(case)
    return _after_failure(case)


@dataclass(frozen=True)
class _Case:
    """An exit being decided: the worker's, the options, and what every case words alike."""

    w: WorkerExit
    o: RunOptions
    returncode: int
    """The return code to decide on: the checkpoint code for a worker whose job committed a
    checkpoint and stopped, whatever it exited with."""
    code: int
    """The exit status to end with (``exit_status(returncode)``)."""
    notes: list[tuple[int, str]]
    cause: str
    """``: why`` when the job's status says why the worker failed, else empty."""
    hint: str
    """How to resume the job (``resume_hint``)."""


def _case(w: WorkerExit, o: RunOptions, checkpoint_dir: str) -> _Case:
    returncode, notes = w.returncode, []
    if returncode != o.exit_code and w.checkpointed:
        # a launcher in between: torchrun's ranks exit 0 after a stop under ferry run (an older
        # ferry's exited 85, which torchrun turns into a failure of its own)
        if returncode != 0:
            notes.append(
                (
                    logging.INFO,
                    f"ferry run: the worker exited with {returncode}, but its job committed a checkpoint "
                    "and stopped: treating it as checkpointed",
                )
            )
        returncode = o.exit_code
    cause = f": {w.error}" if w.error else ""
    return _Case(w, o, returncode, exit_status(returncode), notes, cause, resume_hint(o, checkpoint_dir))


def _after_stop(c: _Case, name: str) -> ExitDecision:
    """A stop signal came: the job ends, checkpointed (and handed back) or failed."""
    w, o, returncode = c.w, c.o, c.returncode
    if returncode == o.exit_code:
        message = f"checkpointed on {name}; {c.hint}"
        return ExitDecision("checkpointed", c.code, message, hand_back=True, notes=tuple(c.notes))
    if w.killed:
        why = f"was killed with SIGKILL after the {o.grace_seconds:g} s grace period"
        if w.progress is not None:
            why += f"; {what_stays(w.progress)}"
    elif returncode < 0:
        why = f"was killed by {signal_name(-returncode)} before it could checkpoint"
    else:
        why = f"exited with {returncode} after {name}, without a committed checkpoint"
    return ExitDecision("failed", c.code, f"the worker {why}{c.cause}", notes=tuple(c.notes))


def _after_checkpoint(c: _Case) -> ExitDecision:
    """The worker checkpointed and stopped with no stop signal: a restart request it was,
    while in-place restarts remain."""
    w, o, notes = c.w, c.o, c.notes
    if w.restart is not None and w.restarts < o.max_restarts:
        env = {str(k): None if v is None else str(v) for k, v in w.restart.items()}
        with_env = " with " + " ".join(f"{k}={v}" for k, v in env.items()) if env else ""
        message = (
            f"ferry run: restarting the worker in place ({w.restarts + 1} of {o.max_restarts}){with_env}"
        )
        return ExitDecision("restart", message=message, env=env, notes=tuple(notes))
    if w.restart is not None:
        notes.append(
            (
                logging.WARNING,
                f"ferry run: a restart in place was requested, but {w.restarts} of {o.max_restarts} "
                f"restarts are used (--max-restarts): exiting with {c.code} instead",
            )
        )
    message = f"the worker checkpointed and stopped; {c.hint}"
    return ExitDecision("checkpointed", c.code, message, notes=tuple(notes))


def _after_failure(c: _Case) -> ExitDecision:
    """A crash, or a death by a signal: restarted after a backoff while ``max_failures`` allows."""
    w, o, returncode, code = c.w, c.o, c.returncode, c.code
    if returncode < 0 and signal_name(-returncode) in w.forwarded:
        message = f"the worker was killed by {signal_name(-returncode)}, which ferry run forwarded"
        return ExitDecision("failed", code, message)
    why = f"was killed by {signal_name(-returncode)}" if returncode < 0 else f"exited with {returncode}"
    if w.failures >= o.max_failures:
        left = "no restarts left" if o.max_failures else "--max-failures N restarts it"
        return ExitDecision("failed", code, f"the worker {why} ({left}){c.cause}")
    failure = w.failures + 1
    delay = backoff_delay(o.backoff_seconds, failure, BACKOFF_CAP_SECONDS)
    c.notes.append(
        (
            logging.WARNING,
            f"ferry run: the worker {why}{c.cause}: failure {failure} of {o.max_failures} allowed; "
            f"restarting it from its last checkpoint in {delay:g} s",
        )
    )
    message = f"the worker {why}; a stop signal came during the backoff, before its restart; {c.hint}"
    return ExitDecision("backoff", o.exit_code, message, delay=delay, notes=tuple(c.notes))
