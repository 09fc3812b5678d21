"""How ``ferry run`` supervises its worker (``RunOptions``), and the check that its command
can start at all."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ferry.config import MAX_SECONDS, Config, Limits
from ferry.errors import ConfigError
from ferry.knobs import BACKOFF_SECONDS, CHECKPOINT_EXIT_CODE, GRACE_SECONDS
from ferry.storage import BACKENDS, scheme
from ferry.storage.extras import backend_problem
from ferry.supervisor.forwarded import FORWARDED

MAX_RESTARTS = 1_000_000
"""More in-place restarts or tolerated failures than this is a typo (or a crash loop)."""
LIMITS = {
    "max_restarts": Limits(low=0, high=MAX_RESTARTS, whole=True),
    "max_failures": Limits(low=0, high=MAX_RESTARTS, whole=True),
    "backoff_seconds": Limits(low=0.0, high=MAX_SECONDS, hint=" (a year)"),
}
"""The supervisor's own numeric options and their ranges (the worker's are Config's)."""
SUPERVISOR_OWNED = {
    "FERRY_DIR": "--dir",
    "FERRY_JOB_ID": "--job-id",
    "FERRY_JOB_DIR": "FERRY_HOME (the job directory is FERRY_HOME/jobs/ID)",
    "FERRY_EXIT_CODE": "--exit-code",
    "FERRY_STOP_SIGNALS": "the stop signals ferry run forwards",
}
"""Worker settings the supervisor relies on and sets itself (``worker._FROM_SUPERVISOR``):
given through ``ferry run --env`` they would be silently overridden, so the CLI refuses them
(a bundle's environment, replayed by ``ferry resume``, may hold them: they are overridden)."""
GRACE = Limits(low=0.0, high=MAX_SECONDS, above=True, hint=" (a year; None: never SIGKILL)")


@dataclass(kw_only=True)
class RunOptions:
    """How ``ferry run`` supervises its worker. None means: the worker's own default."""

    dir: str | None = None
    """Checkpoint root handed to the worker as FERRY_DIR (a path or an fsspec URL).
    None: ``./ferry-checkpoints/<job id>``. Run the job again with the same dir to resume."""
    job_id: str | None = None
    """The job's id; names its job directory, ``<FERRY_HOME>/jobs/<id>``. None: the
    scheduler's job id, else one made of the working directory and the command line
    (``runtime.identity``), so that the same command run there again resumes."""
    fresh: bool = False
    """Start over: delete the checkpoints under the root and its record that the job
    finished, instead of resuming (or of saying that the job finished)."""
    every_steps: int | None = None
    """Periodic checkpoint every N training steps (FERRY_EVERY_STEPS)."""
    every_seconds: float | None = None
    """Periodic checkpoint every N seconds of wall clock (FERRY_EVERY_SECONDS)."""
    keep_last: int | None = None
    """Committed checkpoints to keep (FERRY_KEEP_LAST)."""
    exit_code: int = CHECKPOINT_EXIT_CODE
    """The worker's "checkpointed, resume me" exit status (FERRY_EXIT_CODE); the supervisor
    exits with it too when the job was stopped with a checkpoint."""
    grace_seconds: float | None = GRACE_SECONDS
    """After a stop signal, how long the worker gets to checkpoint and exit before its
    process group is SIGKILLed. None: never. Keep it below the scheduler's own kill timeout."""
    max_restarts: int = 0
    """In-place restarts allowed: a ``restart`` control request makes the worker checkpoint
    and exit, and the supervisor starts it again with the request's env applied (the
    supervisor counts those it did as ``restarts``)."""
    max_failures: int = 0
    """Failures (a non-zero exit other than the checkpoint code, or a death by a signal
    ferry did not send) after which the worker is still restarted from its last checkpoint."""
    backoff_seconds: float = BACKOFF_SECONDS
    """Wait before the n-th restart after a failure: this times 2**(n-1), at most
    ``knobs.BACKOFF_CAP_SECONDS``."""
    autotrack: bool = True
    """Zero-code mode: put ferry's sitecustomize on the worker's PYTHONPATH, FERRY_AUTOTRACK=1."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the worker."""
    resume_command: str | None = None
    """The shell command that resumes this job after a stop, when it is not this one again
    (``ferry resume`` sets it: running that again would restart from the bundle)."""
    allow_changed_inputs: bool = False
    """Resume even when a loader's batch size, dataset length, sampler or drop_last changed
    since the checkpoint (FERRY_ALLOW_CHANGED_INPUTS); the worker refuses otherwise."""
    overlap_snapshot: bool = False
    """Copy what an optimizer's step changes while the next step runs (FERRY_OVERLAP_SNAPSHOT;
    docs/api.md); off: the worker's own FERRY_OVERLAP_SNAPSHOT stands."""
    stop_signals: tuple[str, ...] = ("SIGTERM", "SIGINT", "SIGUSR1")
    """Signals that mean "checkpoint and stop": the worker is told so (FERRY_STOP_SIGNALS),
    and the supervisor starts the grace period when it forwards one."""

    def __post_init__(self) -> None:
        if self.job_id is not None:
            check_job_id(self.job_id)
        for name, limits in LIMITS.items():
            limits.check(name, getattr(self, name))
        if self.grace_seconds is not None:
            GRACE.check("grace_seconds", self.grace_seconds)
        if self.dir is not None:
            try:
                check_root(self.dir)
            except ConfigError as exc:
                raise ConfigError(f"dir {exc}") from None
        for name in self.stop_signals:
            signum = getattr(signal, name, None)
            if isinstance(signum, signal.Signals) and signum not in FORWARDED:
                raise ConfigError(f"{name} cannot be a stop signal: the supervisor cannot forward it")
        for key in self.env:
            if not key or "=" in key:
                raise ConfigError(f"environment variable name {key!r} is empty or holds '='")
        # The worker's own checks, with the worker's messages, before anything starts.
        self.worker_config()

    def worker_settings(self) -> dict[str, Any]:
        """The worker's Config fields these options set (the rest are the worker's defaults)."""
        settings: dict[str, Any] = {
            "every_steps": self.every_steps,
            "every_seconds": self.every_seconds,
            "keep_last": self.keep_last,
            "exit_code": self.exit_code,
            "stop_signals": self.stop_signals,
            "grace_seconds": self.grace_seconds,
            "allow_changed_inputs": self.allow_changed_inputs or None,
            "overlap_snapshot": self.overlap_snapshot or None,
        }
        return {k: v for k, v in settings.items() if v is not None}

    def worker_config(self, **more: Any) -> Config:
        """The worker's Config as these options (and ``more``) set it; ConfigError as the
        worker would raise it."""
        return Config(**self.worker_settings(), **more)


def check_job_id(job_id: str) -> str:
    """A job id names a folder under FERRY_HOME/jobs: ConfigError for one that names another."""
    if job_id in ("", ".", "..") or "/" in job_id or "\0" in job_id:
        raise ConfigError(f"job id {job_id!r} names a folder: use no '/', and not '.' or '..'")
    return job_id


def check_root(url: str) -> str:
    """A checkpoint root a supervised job can resume from, checked before any worker starts:
    ConfigError (starting with the URL) for a scheme no backend knows, a backend whose
    package is not installed (with its install line), and ``memory://``, which lives in one
    process's memory and is gone when the worker exits."""
    proto = scheme(url)
    if proto == "memory":
        raise ConfigError(
            f"{url!r}: a memory:// root lives in the worker's memory and is gone when it exits, "
            "so the job could never resume from it: give a path, or a store that outlives the "
            "worker (s3://, root://, ...)"
        )
    if not url or "\0" in url:
        raise ConfigError(f"{url!r} is not a path or URL: name a folder, e.g. ./ferry-checkpoints")
    if proto in BACKENDS:
        return url
    problem = backend_problem(url, proto)
    if problem is not None:
        raise ConfigError(problem)
    return url


def check_command(command: Sequence[str], path: str | None, cwd: str | None = None) -> None:
    """Refuse, with the fix, a command that cannot start, before the job directory is touched.
    ``cwd``: the folder it will run in (default: this process's)."""
    here = cwd or os.getcwd()
    if not command:
        raise ConfigError("no command given: put it after --, e.g. `ferry run -- python train.py`")
    argv0 = command[0]
    if argv0.startswith("-"):
        raise ConfigError(
            f"{argv0!r} is not a command (an unknown option?): ferry run's options go first, "
            "the command after --, e.g. `ferry run --every-steps 100 -- python train.py`"
        )
    if os.sep in argv0:
        argv0 = os.path.join(here, argv0)
        if not os.path.isfile(argv0):
            raise ConfigError(f"cannot run {command[0]!r}: no such file (in {here})")
        if not os.access(argv0, os.X_OK):
            raise ConfigError(
                f"cannot run {command[0]!r}: it is not executable; chmod +x it, or name its "
                f"interpreter: `ferry run -- python {command[0]}`"
            )
    elif shutil.which(argv0, path=path) is None:
        raise ConfigError(f"cannot run {argv0!r}: command not found on PATH")
    _check_script(command, here)


_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_PYTHON_VALUE_OPTIONS = ("-W", "-X", "-Q")


def _check_script(command: Sequence[str], cwd: str) -> None:
    """``python SCRIPT``: the script must exist, or the worker fails at once, and a restart
    would fail the same way."""
    if not _PYTHON.match(os.path.basename(command[0])):
        return
    args = iter(command[1:])
    for arg in args:
        if arg in ("-c", "-m", "-"):
            return
        if arg in _PYTHON_VALUE_OPTIONS:
            next(args, None)
        elif not arg.startswith("-"):
            if not os.path.exists(os.path.join(cwd, arg)):
                raise ConfigError(
                    f"cannot run {shlex.join(command[:4])}: no such script {arg!r} (in {cwd}); check the path"
                )
            return
