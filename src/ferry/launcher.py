"""``ferry run``: the supervisor that starts a training command as its worker and outlives it.

The supervisor owns the job directory (``job.json``, ``status.json``, the ``lock`` it holds
for its whole life), starts the worker in a process group of its own, forwards every
signal it receives to that whole group, escalates a stop to SIGKILL when the worker
overstays the grace period, and reads the worker's exit status:

* 0: finished; the supervisor exits 0.
* the checkpoint code (85): the worker committed a checkpoint and stopped. The supervisor
  exits 85 too ("resume me"), unless the stop was a ``restart`` control request and
  in-place restarts remain: then it starts the worker again with the request's env.
* anything else (86: the checkpoint at a stop failed; a crash; a signal ferry did not
  send): a failure. Restarted from the last checkpoint after a backoff while
  ``max_failures`` allows, else propagated (128 + N for signal N).

Its signal handlers only record the signal; the main loop does the forwarding. The rules
and the files are documented in docs/jobs.md.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import logging
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from ferry.autotrack import BOOT_DIR
from ferry.config import Config
from ferry.errors import ConfigError
from ferry.runtime.jobdir import JobDir, write_json_atomic
from ferry.runtime.procs import group_members, tagged
from ferry.schedulers import detect as detect_scheduler

log = logging.getLogger("ferry.run")

BACKOFF_CAP_SECONDS = 60.0
"""The longest wait between a failure and the restart."""
LEFTOVER_SECONDS = 5.0
"""How long processes the worker left in its group get after SIGTERM, before SIGKILL."""
POLL_SECONDS = 0.5
"""The main loop wakes on every signal (SIGCHLD included); this is only a safety net."""

_NOT_FORWARDED = {
    name
    for name in (
        "SIGKILL",  # cannot be caught
        "SIGSTOP",
        "SIGCHLD",  # the supervisor's own: its worker changed state
        "SIGSEGV",  # faults of the supervisor itself, not requests for the worker
        "SIGBUS",
        "SIGFPE",
        "SIGILL",
        "SIGTRAP",
        "SIGSYS",
        "SIGABRT",
        "SIGPIPE",  # the supervisor's own output went away
        "SIGTTIN",  # terminal job control of the supervisor itself
        "SIGTTOU",
    )
    if hasattr(signal, name)
}


def _forwardable(signum: int) -> bool:
    try:
        return signal.Signals(signum).name not in _NOT_FORWARDED
    except ValueError:  # a real-time signal without a name of its own
        return True


FORWARDED = tuple(int(s) for s in sorted(signal.valid_signals()) if _forwardable(s))
"""Every signal the supervisor catches and passes on to the worker's process group."""


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"


def exit_status(returncode: int) -> int:
    """A Popen return code as a shell reports it: 128 + N for a death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass(kw_only=True)
class RunOptions:
    """How ``ferry run`` supervises its worker. None means: the worker's own default."""

    dir: str | None = None
    """Checkpoint root handed to the worker as FERRY_DIR (a path or an fsspec URL).
    None: ``./ferry-checkpoints/<job id>``. Run the job again with the same dir to resume."""
    job_id: str | None = None
    """The job's id; names its job directory, ``<FERRY_HOME>/jobs/<id>``.
    None: ``<host>-<supervisor pid>``."""
    every_steps: int | None = None
    """Periodic checkpoint every N training steps (FERRY_EVERY_STEPS)."""
    every_seconds: float | None = None
    """Periodic checkpoint every N seconds of wall clock (FERRY_EVERY_SECONDS)."""
    keep_last: int | None = None
    """Committed checkpoints to keep (FERRY_KEEP_LAST)."""
    exit_code: int = 85
    """The worker's "checkpointed, resume me" exit status (FERRY_EXIT_CODE); the supervisor
    exits with it too when the job was stopped with a checkpoint."""
    grace_seconds: float | None = 30.0
    """After a stop signal, how long the worker gets to checkpoint and exit before its
    process group is SIGKILLed. None: never. Keep it below the scheduler's own kill timeout."""
    restarts: int = 0
    """In-place restarts allowed: a ``restart`` control request makes the worker checkpoint
    and exit, and the supervisor starts it again with the request's env applied."""
    max_failures: int = 0
    """Failures (a non-zero exit other than the checkpoint code, or a death by a signal
    ferry did not send) after which the worker is still restarted from its last checkpoint."""
    backoff_seconds: float = 1.0
    """Wait before the n-th restart after a failure: this times 2**(n-1), at most 60 s."""
    autotrack: bool = True
    """Zero-code mode: put ferry's sitecustomize on the worker's PYTHONPATH, FERRY_AUTOTRACK=1."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the worker."""
    stop_signals: tuple[str, ...] = ("SIGTERM", "SIGINT", "SIGUSR1")
    """Signals that mean "checkpoint and stop": the worker is told so (FERRY_STOP_SIGNALS),
    and the supervisor starts the grace period when it forwards one."""

    def __post_init__(self) -> None:
        if self.job_id is not None and (
            self.job_id in ("", ".", "..") or "/" in self.job_id or "\0" in self.job_id
        ):
            raise ConfigError(f"job id {self.job_id!r} names a folder: use no '/', and not '.' or '..'")
        for name in ("restarts", "max_failures", "backoff_seconds"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.grace_seconds is not None and self.grace_seconds <= 0:
            raise ConfigError(f"grace_seconds must be > 0 (None: never SIGKILL), got {self.grace_seconds}")
        for name in self.stop_signals:
            signum = getattr(signal, name, None)
            if isinstance(signum, signal.Signals) and signum not in FORWARDED:
                raise ConfigError(f"{name} cannot be a stop signal: the supervisor cannot forward it")
        for key in self.env:
            if not key or "=" in key:
                raise ConfigError(f"environment variable name {key!r} is empty or holds '='")
        # The worker's own checks, with the worker's messages, before anything starts.
        settings: dict[str, Any] = {
            "every_steps": self.every_steps,
            "every_seconds": self.every_seconds,
            "keep_last": self.keep_last,
            "exit_code": self.exit_code,
            "stop_signals": self.stop_signals,
            "grace_seconds": self.grace_seconds,
        }
        Config(**{k: v for k, v in settings.items() if v is not None})


def check_command(command: Sequence[str], path: str | None) -> None:
    """Refuse, with the fix, a command that cannot start, before the job directory is touched."""
    if not command:
        raise ConfigError("no command given: put it after --, e.g. `ferry run -- python train.py`")
    argv0 = command[0]
    if argv0.startswith("-"):
        raise ConfigError(
            f"{argv0!r} is not a command (an unknown option?): ferry run's options go first, "
            "the command after --, e.g. `ferry run --every-steps 100 -- python train.py`"
        )
    if os.sep in argv0:
        if not os.path.isfile(argv0):
            raise ConfigError(f"cannot run {argv0!r}: no such file")
        if not os.access(argv0, os.X_OK):
            raise ConfigError(
                f"cannot run {argv0!r}: it is not executable; chmod +x it, or name its "
                f"interpreter: `ferry run -- python {argv0}`"
            )
    elif shutil.which(argv0, path=path) is None:
        raise ConfigError(f"cannot run {argv0!r}: command not found on PATH")


class Supervisor:
    """Runs one job's worker to its end; ``run()`` returns the exit status for the shell."""

    def __init__(self, command: Sequence[str], options: RunOptions | None = None) -> None:
        self.command = list(command)
        self.options = options or RunOptions()
        # The batch system running us (docs/schedulers.md) names the job, so that its restarts
        # resume it, and may dictate the checkpoint exit code (HTCondor's job ad).
        self.scheduler = detect_scheduler()
        code = self.scheduler.exit_code(self.options.exit_code)
        if code != self.options.exit_code:
            self.options = dataclasses.replace(self.options, exit_code=code)
        self.job_id = (
            self.options.job_id or self.scheduler.job_id() or f"{socket.gethostname()}-{os.getpid()}"
        )
        ckpt = self.options.dir or os.path.join("ferry-checkpoints", self.job_id)
        self.checkpoint_dir = ckpt if "://" in ckpt else os.path.abspath(ckpt)
        self.job: JobDir | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.failures = 0
        self._stop_signums = {int(getattr(signal, n)) for n in self.options.stop_signals}
        self._pending: collections.deque[int] = collections.deque()
        self._wakeup = -1
        self._stop_signal: int | None = None  # the first stop signal the supervisor received
        self._sent: set[int] = set()  # signals sent to the current worker's group
        self._kill_at: float | None = None
        self._killed = False
        self._restart_env: dict[str, str | None] = {}
        self._restart_reason: dict[str, Any] | None = None
        self._down_since = 0.0

    # ------------------------------------------------------------------ public
    def run(self) -> int:
        """Supervise until the job finished, checkpointed or failed; returns the exit status."""
        check_command(self.command, self.options.env.get("PATH", os.environ.get("PATH")))
        # The worker's FERRY_* settings: a bad one would otherwise surface in the worker, which
        # would then train unprotected or fail at its first batch.
        Config.from_env({**self._user_env(), "FERRY_DIR": self.checkpoint_dir})
        self.job = JobDir.create(self.job_id)
        self.job.acquire_lock()
        try:
            self._begin()
            with self._signal_handlers():
                while True:
                    self._start()
                    returncode = self._watch()
                    self._clear_group()
                    code = self._after_exit(returncode)
                    if code is not None:
                        return code
        finally:
            self._abandon()
            self.job.release_lock()

    # ------------------------------------------------------------------ the worker
    def _user_env(self) -> dict[str, str]:
        """The worker's environment before the supervisor's own settings: ours, the options',
        ``--env``, a restart request's."""
        o = self.options
        env = dict(os.environ)
        settings = {
            "FERRY_EVERY_STEPS": o.every_steps,
            "FERRY_EVERY_SECONDS": o.every_seconds,
            "FERRY_KEEP_LAST": o.keep_last,
            "FERRY_GRACE_SECONDS": o.grace_seconds,
        }
        env.update({k: str(v) for k, v in settings.items() if v is not None})
        env.update(o.env)
        for key, value in self._restart_env.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def _worker_env(self) -> dict[str, str]:
        assert self.job is not None
        o = self.options
        env = self._user_env()
        # What the supervisor relies on comes last: nothing overrides it.
        env.update(
            FERRY_JOB_ID=self.job_id,
            FERRY_SUPERVISOR_PID=str(os.getpid()),
            FERRY_JOB_DIR=self.job.path,
            FERRY_DIR=self.checkpoint_dir,
            FERRY_EXIT_CODE=str(o.exit_code),
            FERRY_STOP_SIGNALS=",".join(o.stop_signals),
            FERRY_AUTOTRACK="1" if o.autotrack else "0",
        )
        if os.path.isdir("/dev/shm"):  # host memory for the state across an in-place restart
            env.setdefault("FERRY_HANDOFF_DIR", self._handoff_dir)
        if o.autotrack:
            paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOT_DIR]
            env["PYTHONPATH"] = os.pathsep.join([BOOT_DIR, *paths])
        return env

    def _begin(self) -> None:
        assert self.job is not None
        try:
            import pwd

            user = pwd.getpwuid(os.getuid()).pw_name
        except (ImportError, KeyError):
            user = str(os.getuid())
        self.job.write_identity(
            id=self.job_id,
            command=self.command,
            cwd=os.getcwd(),
            user=user,
            supervisor_pid=os.getpid(),
            worker_pid=None,
            checkpoint_dir=self.checkpoint_dir,
            scheduler=self.scheduler.name,
            scheduler_restarts=self.scheduler.restart_count(),
        )
        # A new run: what the previous one concluded no longer holds (checkpoints stay listed).
        self.job.update_status(
            "starting",
            supervisor_pid=os.getpid(),
            worker_pid=None,
            exit_code=None,
            error=None,
            restart=None,
            restarts=0,
            max_restarts=self.options.restarts,
            failures=0,
            started=time.time(),
        )
        self.job.event("run_start", supervisor_pid=os.getpid(), command=self.command)
        log.info(
            "ferry run: job %s (job directory %s), checkpoints under %s",
            self.job_id,
            self.job.path,
            self.checkpoint_dir,
        )

    def _start(self) -> None:
        assert self.job is not None
        env = self._worker_env()
        self.job.update_status(
            "starting",
            worker_pid=None,
            restarts=self.restarts,
            failures=self.failures,
            worker_started=time.time(),
        )
        try:
            self.proc = subprocess.Popen(self.command, start_new_session=True, env=env)
        except OSError as exc:
            error = f"cannot run {self.command[0]!r}: {exc.strerror or exc}"
            self.job.update_status("failed", error=error, exit_code=ConfigError.exit_code)
            self.job.event("run_end", state="failed", exit_code=ConfigError.exit_code, message=error)
            raise ConfigError(f"{error}; check the command after --") from None
        pid = self.proc.pid
        self._sent.clear()
        self._kill_at, self._killed = None, False
        identity = self.job.identity()
        write_json_atomic(self.job.file("job.json"), {**identity, "worker_pid": pid})
        self.job.update_status("starting", worker_pid=pid)
        self.job.event("worker_start", pid=pid, restarts=self.restarts, failures=self.failures)
        if self._restart_reason is not None:
            downtime = time.time() - self._down_since
            self.job.event("restart", pid=pid, downtime_seconds=downtime, **self._restart_reason)
            self._restart_reason = None
        log.info("ferry run: worker pid %d started: %s", pid, shlex.join(self.command))

    def _watch(self) -> int:
        """Forward signals until the worker exits; returns its Popen return code."""
        assert self.proc is not None
        while True:
            self._drain()
            returncode = self.proc.poll()
            if returncode is not None:
                return returncode
            timeout = POLL_SECONDS
            if self._kill_at is not None:
                left = self._kill_at - time.monotonic()
                if left <= 0:
                    self._escalate()
                else:
                    timeout = min(timeout, left)
            self._wait(timeout)

    # ------------------------------------------------------------------ signals
    @contextlib.contextmanager
    def _signal_handlers(self) -> Iterator[None]:
        """Catch every forwardable signal (and SIGCHLD, to wake up) while supervising.

        The handlers replace, rather than chain to, the ones before: the supervisor's whole
        job is to pass signals on, and the Python defaults (KeyboardInterrupt) would kill it.
        They are put back on the way out."""
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        previous: dict[int, Any] = {}
        old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        try:
            for signum in (*FORWARDED, signal.SIGCHLD):
                with contextlib.suppress(OSError, ValueError):
                    previous[signum] = signal.signal(signum, self._record)
            self._wakeup = r
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
            signal.set_wakeup_fd(old_fd)
            os.close(r)
            os.close(w)
            self._wakeup = -1

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self._pending.append(signum)

    def _drain(self) -> None:
        while self._pending:
            self._forward(self._pending.popleft())

    def _wait(self, timeout: float) -> None:
        """Sleep until a signal arrives (the wakeup fd turns readable) or ``timeout``."""
        select.select([self._wakeup], [], [], max(timeout, 0.0))
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wakeup, 512):
                pass

    def _killpg(self, signum: int) -> None:
        """Signal the worker's process group, and the job's processes outside it (torchrun
        starts each rank in a session of its own)."""
        assert self.proc is not None
        strays = _strays(self.proc.pid)
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            if not strays:
                return
        for pid in strays:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        self._sent.add(signum)

    def _forward(self, signum: int) -> None:
        if signum == signal.SIGCHLD:
            return
        name = signal_name(signum)
        stop = signum in self._stop_signums
        if stop and self._stop_signal is None:
            self._stop_signal = signum
        if self.proc is None or self.proc.returncode is not None:
            log.debug("ferry run: %s arrived with no worker running", name)
            return
        if signum == signal.SIGTSTP:
            # Terminal suspend (^Z): the worker first, then ourselves; SIGCONT is forwarded
            # on the way back. SIGSTOP, since the kernel discards SIGTSTP sent to the worker's
            # group: in a session of its own, that group counts as orphaned.
            self._killpg(signal.SIGSTOP)
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        self._killpg(signum)
        if not stop:
            log.debug("ferry run: forwarded %s to the worker's process group", name)
            return
        assert self.job is not None
        self.job.event("signal", signal=name, action="stop")
        grace = self.options.grace_seconds
        if self._kill_at is None and grace is not None:
            self._kill_at = time.monotonic() + grace
            log.info(
                "ferry run: %s: the worker checkpoints and stops; SIGKILL in %g s if it has not exited",
                name,
                grace,
            )

    def _escalate(self) -> None:
        assert self.job is not None and self._stop_signal is not None
        grace = self.options.grace_seconds
        name = signal_name(self._stop_signal)
        log.error(
            "ferry run: the worker did not exit within %g s of %s: killing its process group with "
            "SIGKILL; this stop leaves no new checkpoint (the last committed one stays)",
            grace,
            name,
        )
        self.job.event("grace_kill", signal=name, grace_seconds=grace)
        self._killpg(signal.SIGKILL)
        self._kill_at, self._killed = None, True

    # ------------------------------------------------------------------ after the worker
    def _clear_group(self) -> None:
        """Processes the worker left in its group (children it did not wait for) must not
        outlive it: they may hold the GPU the next worker needs."""
        assert self.proc is not None
        pgid = self.proc.pid
        if not _wait_group_gone(pgid, 1.0):
            members = _group_members(pgid)
            log.warning(
                "ferry run: the worker exited but left %d process(es) in its group (%s): SIGTERM, "
                "then SIGKILL after %g s",
                len(members),
                ", ".join(map(str, members)),
                LEFTOVER_SECONDS,
            )
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            if not _wait_group_gone(pgid, LEFTOVER_SECONDS):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
        strays = _strays(pgid)
        if strays:  # e.g. the ranks of a torchrun agent that was killed
            log.warning(
                "ferry run: %d process(es) of the job outlived the worker outside its group (%s): "
                "SIGTERM, then SIGKILL after %g s",
                len(strays),
                ", ".join(map(str, strays)),
                LEFTOVER_SECONDS,
            )
            for sig, wait in ((signal.SIGTERM, LEFTOVER_SECONDS), (signal.SIGKILL, 1.0)):
                for pid in strays:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)
                deadline = time.monotonic() + wait
                while (strays := _strays(pgid)) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if not strays:
                    break

    def _after_exit(self, returncode: int) -> int | None:
        """The supervisor's exit status, or None to start the worker again."""
        assert self.job is not None
        o = self.options
        code = exit_status(returncode)
        self._down_since = time.time()
        self._drain()  # a stop signal that came with the exit decides against a restart
        self.job.event(
            "worker_exit",
            pid=self.proc.pid if self.proc else None,
            returncode=returncode,
            signal=signal_name(-returncode) if returncode < 0 else None,
        )
        if returncode == 0:
            return self._end("finished", 0, "the worker finished")
        if returncode != o.exit_code and self._worker_checkpointed():
            # a launcher in between (torchrun) turns its workers' 85 into a failure of its own
            log.info(
                "ferry run: the worker exited with %d, but its job committed a checkpoint and "
                "stopped: treating it as checkpointed",
                returncode,
            )
            returncode = o.exit_code
            code = exit_status(returncode)
        if self._stop_signal is not None:  # the scheduler (or the operator) wants the job gone
            name = signal_name(self._stop_signal)
            if returncode == o.exit_code:
                # The scheduler may take the job back (SLURM requeues it) and pick the status. It
                # comes last: SLURM kills the batch step soon after the requeue, so the job's end
                # is recorded first.
                step = self.job.status().get("step")
                self._end("checkpointed", code, f"checkpointed on {name}; {self._resume_hint()}")
                return self.scheduler.after_checkpoint(
                    step=step if isinstance(step, int) else None, code=code, state_dir=self.job.path
                )
            if self._killed:
                why = f"was killed with SIGKILL after the {o.grace_seconds:g} s grace period"
            elif returncode < 0:
                why = f"was killed by {signal_name(-returncode)} before it could checkpoint"
            else:
                why = f"exited with {returncode} after {name}, without a committed checkpoint"
            return self._end("failed", code, f"the worker {why}")
        if returncode == o.exit_code:
            restart = self.job.status().get("restart")
            if isinstance(restart, dict) and self.restarts < o.restarts:
                self._restart_in_place(restart)
                return None
            if isinstance(restart, dict):
                log.warning(
                    "ferry run: a restart in place was requested, but %d of %d restarts are used "
                    "(--restarts): exiting with %d instead",
                    self.restarts,
                    o.restarts,
                    code,
                )
            return self._end(
                "checkpointed", code, f"the worker checkpointed and stopped; {self._resume_hint()}"
            )
        if returncode < 0 and -returncode in self._sent:
            name = signal_name(-returncode)
            return self._end("failed", code, f"the worker was killed by {name}, which ferry run forwarded")
        why = f"was killed by {signal_name(-returncode)}" if returncode < 0 else f"exited with {returncode}"
        if self.failures >= o.max_failures:
            hint = "no restarts left" if o.max_failures else "--max-failures N restarts it"
            return self._end("failed", code, f"the worker {why} ({hint})")
        self.failures += 1
        delay = min(o.backoff_seconds * 2 ** (self.failures - 1), BACKOFF_CAP_SECONDS)
        log.warning(
            "ferry run: the worker %s: failure %d of %d allowed; restarting it from its last "
            "checkpoint in %g s",
            why,
            self.failures,
            o.max_failures,
            delay,
        )
        self._restart_reason = {"reason": "failure", "returncode": returncode, "backoff_seconds": delay}
        if self._sleep(delay):
            return None
        return self._end(
            "checkpointed",
            o.exit_code,
            f"the worker {why}; a stop signal came during the backoff, before its restart; "
            + self._resume_hint(),
        )

    def _worker_checkpointed(self) -> bool:
        """Did the worker that just exited commit a checkpoint and stop (status.json says so,
        written after it started)?"""
        assert self.job is not None
        status = self.job.status()
        started = float(status.get("worker_started", 0) or 0)
        return status.get("state") == "checkpointed" and float(status.get("updated", 0)) >= started

    def _resume_hint(self) -> str:
        if self.options.dir or self.options.job_id:
            return "run the same command again to resume"
        return f"to resume, run it again with --dir {shlex.quote(self.checkpoint_dir)}"

    def _restart_in_place(self, restart: dict[Any, Any]) -> None:
        assert self.job is not None
        env = {str(k): None if v is None else str(v) for k, v in restart.items()}
        self.restarts += 1
        self._restart_env.update(env)
        status = self.job.status()
        self._down_since = float(status.get("updated", self._down_since))
        self.job.update_status("checkpointed", restart=None)  # taken: a later exit must not reuse it
        self._restart_reason = {"reason": "requested", "env": env, "step": status.get("step")}
        log.info(
            "ferry run: restarting the worker in place (%d of %d)%s",
            self.restarts,
            self.options.restarts,
            " with " + " ".join(f"{k}={v}" for k, v in env.items()) if env else "",
        )

    def _sleep(self, seconds: float) -> bool:
        """Wait with no worker running; False when a stop signal arrives meanwhile."""
        deadline = time.monotonic() + seconds
        while True:
            self._drain()
            if self._stop_signal is not None:
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            self._wait(left)

    @property
    def _handoff_dir(self) -> str:
        """Per job directory, not per job id: two jobs may share an id under two FERRY_HOMEs."""
        assert self.job is not None
        key = hashlib.sha1(os.path.realpath(self.job.path).encode()).hexdigest()[:16]
        return f"/dev/shm/ferry-{os.getuid()}-{key}"

    def _end(self, state: str, code: int, message: str) -> int:
        assert self.job is not None
        shutil.rmtree(self._handoff_dir, ignore_errors=True)
        fields: dict[str, Any] = {"exit_code": code, "ended": time.time()}
        if state == "failed":
            fields["error"] = message
        self.job.update_status(state, **fields)
        self.job.event("run_end", state=state, exit_code=code, message=message)
        (log.info if state != "failed" else log.error)("ferry run: %s; exit %d", message, code)
        return code

    def _abandon(self) -> None:
        """The supervisor is leaving with its worker still running (it failed itself): stop
        the worker as a scheduler would, rather than leave it orphaned."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        grace = self.options.grace_seconds or LEFTOVER_SECONDS
        log.error("ferry run: the supervisor is exiting early; stopping worker pid %d (SIGTERM)", proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        return [pgid]
    return group_members(pgid) if os.path.isdir("/proc") else [pgid]


def _strays(pgid: int) -> list[int]:
    """Live processes of this supervisor's job outside the worker's group ``pgid``: every
    process of the job inherits FERRY_SUPERVISOR_PID from the worker's environment."""
    return tagged(f"FERRY_SUPERVISOR_PID={os.getpid()}", outside_group=pgid)


def _wait_group_gone(pgid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _group_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
