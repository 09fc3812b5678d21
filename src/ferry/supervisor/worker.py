"""The worker: its environment, its process group, and clearing up after it.

The worker runs in a process group (and session) of its own, so that a signal reaches all
of it and nothing of the supervisor. Every process of the job inherits
``FERRY_SUPERVISOR_PID``, which finds the ones that left the group (torchrun starts each
rank in a session of its own). The worker holds the job's locks with the supervisor and
gets a stop signal when the supervisor dies: it checkpoints and stops instead of training
on unsupervised.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from ferry.autotrack import BOOT_DIR
from ferry.knobs import GROUP_EXIT_SECONDS, LEFTOVER_SECONDS, PROCESS_POLL_SECONDS
from ferry.runtime.procs import environ_has, group_members, tagged
from ferry.runtime.warmstart import ENV as WARM_ENV
from ferry.supervisor.options import RunOptions

log = logging.getLogger("ferry.run")


_FROM_OPTIONS = ("every_steps", "every_seconds", "keep_last", "grace_seconds")
"""Config fields ``ferry run``'s options set when given; ``--env`` may override them."""
_FROM_SUPERVISOR = ("job_id", "job_dir", "dir", "exit_code", "stop_signals")
"""Config fields the supervisor relies on: nothing overrides them."""


def user_env(
    base: Mapping[str, str], options: RunOptions, restart_env: Mapping[str, str | None]
) -> dict[str, str]:
    """The worker's environment before the supervisor's own settings: ``base`` (the
    supervisor's), the options', ``--env``, a restart request's (None: unset)."""
    env = dict(base)
    given = [name for name in _FROM_OPTIONS if getattr(options, name) is not None]
    # Flags that are off leave the worker's own FERRY_ALLOW_CHANGED_INPUTS and
    # FERRY_OVERLAP_SNAPSHOT as they are.
    given += [name for name in ("allow_changed_inputs", "overlap_snapshot") if getattr(options, name)]
    env.update(options.worker_config().to_env(given))
    env.update(options.env)
    for key, value in restart_env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def worker_env(
    user: Mapping[str, str],
    options: RunOptions,
    *,
    job_id: str,
    job_dir: str,
    checkpoint_dir: str,
    handoff_dir: str | None,
) -> dict[str, str]:
    """The worker's whole environment: ``user`` (from ``user_env``), then what the
    supervisor relies on. ``handoff_dir``: host memory for the state across an in-place
    restart (None: there is no tmpfs); FERRY_HANDOFF_DIR in ``user`` wins."""
    env = dict(user)
    env.pop(WARM_ENV, None)  # only a warm worker gets one, from the supervisor (supervisor/warm.py)
    config = options.worker_config(
        dir=checkpoint_dir, job_id=job_id, job_dir=job_dir, handoff_dir=handoff_dir
    )
    env.update(config.to_env(_FROM_SUPERVISOR))
    env["FERRY_SUPERVISOR_PID"] = str(os.getpid())
    env["FERRY_AUTOTRACK"] = "1" if options.autotrack else "0"
    if handoff_dir is not None:
        for key, value in config.to_env(("handoff_dir",)).items():
            env.setdefault(key, value)
    if options.autotrack:
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOT_DIR]
        env["PYTHONPATH"] = os.pathsep.join([BOOT_DIR, *paths])
    return env


def handoff_dir(job_path: str) -> str:
    """Per job directory, not per job id: two jobs may share an id under two FERRY_HOMEs.
    Inside a folder of this user's own (``/dev/shm/ferry-<uid>``, 0700), which the worker
    checks before it trusts anything there (``ferry.runtime.handoff``): anyone can compute
    these names."""
    key = hashlib.sha1(os.path.realpath(job_path).encode()).hexdigest()[:16]
    return f"/dev/shm/ferry-{os.geteuid()}/{key}"


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
RANK_MARK = "TORCHELASTIC_RUN_ID"
"""Set by torchrun's agent in each rank it starts: a process of the job that is a rank."""
_WHOLE_GROUP = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT}
"""Signals for every process of the job, the launcher included: the end of a grace period,
a terminal's suspend and resume."""


def die_with_parent(signum: int) -> Callable[[], None] | None:
    """For ``preexec_fn``: the started process gets ``signum`` when this process dies, even
    by SIGKILL, so that the worker never trains on unsupervised (None where the kernel
    has no parent-death signal). A parent already gone before the ``prctl`` is caught by
    comparing the parent pid: the command is then not run at all (a signal raised here
    would meet the parent's handlers, copied by the fork)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded here: not after the fork
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        if prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signum), 0, 0, 0) == 0 and os.getppid() != parent:
            os._exit(128 + signum)

    return arm


class WorkerGroup:
    """One started worker: its process group and the job's processes outside it."""

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        *,
        locks: tuple[int, ...] = (),
        pdeathsig: int | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
    ) -> None:
        """Start ``command``; OSError when it cannot be. ``locks``: descriptors the worker
        inherits (flock'ed files it holds too; a warm worker's pipes); ``pdeathsig``: the signal
        it gets if the supervisor dies; ``stdout``, ``stderr``: other than the supervisor's."""
        self.proc = subprocess.Popen(
            list(command),
            start_new_session=True,
            env=dict(env),
            pass_fds=locks,
            preexec_fn=None if pdeathsig is None else die_with_parent(pdeathsig),
            stdout=stdout,
            stderr=stderr,
        )
        self.pid = self.proc.pid
        self.sent: set[int] = set()
        """Signals sent to this worker's group (a death by one of them is ferry's doing)."""
        self.spare: set[int] = set()
        """Process groups of the job's other workers (during a warm migration: the warm one, the
        one it took over from): outside this group, and yet no strays of this worker's, to
        signal or clear. The supervisor shares one set among its workers."""

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def signal(self, signum: int) -> None:
        """Signal the worker's process group, and the job's processes outside it. Where the
        worker is a launcher whose ranks run in sessions of their own (torchrun's agent), the
        ranks (and what they started) get it and the launcher does not: a rank stops, saves or
        ignores a signal as the job's training process, while torchrun's agent would end its
        ranks on any of them and report the stop as a failure of its own (a traceback)."""
        strays = _strays(self.pid, self.spare)
        if signum not in _WHOLE_GROUP and any(environ_has(pid, RANK_MARK) for pid in strays):
            for pid in strays:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signum)
            self.sent.add(signum)
            return
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            if not strays:
                return
        for pid in strays:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        self.sent.add(signum)

    def clear(self) -> None:
        """Processes the worker left in its group (children it did not wait for) must not
        outlive it: they may hold the GPU the next worker needs."""
        pgid = self.pid
        if not _wait_group_gone(pgid, GROUP_EXIT_SECONDS):
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
        strays = _strays(pgid, self.spare)
        if strays:  # e.g. the ranks of a torchrun agent that was killed
            log.warning(
                "ferry run: %d process(es) of the job outlived the worker outside its group (%s): "
                "SIGTERM, then SIGKILL after %g s",
                len(strays),
                ", ".join(map(str, strays)),
                LEFTOVER_SECONDS,
            )
            for sig, wait in ((signal.SIGTERM, LEFTOVER_SECONDS), (signal.SIGKILL, GROUP_EXIT_SECONDS)):
                for pid in strays:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)
                deadline = time.monotonic() + wait
                while (strays := _strays(pgid, self.spare)) and time.monotonic() < deadline:
                    time.sleep(PROCESS_POLL_SECONDS)
                if not strays:
                    break

    def abandon(self, grace: float, *, quiet: bool = False) -> None:
        """The supervisor is leaving with its worker still running (it failed itself): stop
        the worker as a scheduler would, rather than leave it orphaned. ``quiet``: a worker
        that is exiting anyway (it handed over to a warm one) gets ``grace`` first."""
        proc = self.proc
        if quiet:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        if proc.poll() is not None:
            return
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


def _strays(pgid: int, spare: set[int] | None = None) -> list[int]:
    """Live processes of this supervisor's job outside the worker's group ``pgid`` and the
    other workers' groups ``spare``: every process of the job inherits FERRY_SUPERVISOR_PID
    from the worker's environment."""
    found = tagged(f"FERRY_SUPERVISOR_PID={os.getpid()}", outside_group=pgid)
    others = (spare or set()) - {pgid}
    if not others:
        return found
    return [pid for pid in found if _pgid(pid) not in others]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _wait_group_gone(pgid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _group_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(PROCESS_POLL_SECONDS)
    return True
