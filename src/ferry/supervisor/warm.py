"""The supervisor's side of a warm migration: the request that asks for a warm worker, and
the warm worker itself, from its start to its take-over or its end.

``ferry migrate`` drops ``control/warm-<id>.json`` (the target's ``env``); the supervisor
takes it at its next wake-up, starts the same command with that env as a second worker
(``WarmWorker``) and answers ``resp-<id>.json`` once the warm worker waits at its restore
point (``ok``), or when it could not get there (the error says why; the job trains on as
before). The request files are the worker's request files' kin (runtime/control.py): written
to a temporary name then renamed, obeyed only when this user's own regular file, answered
in the same format. The worker's side is ``ferry.session.warm``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypedDict

from ferry.errors import JobError, bug
from ferry.runtime.atomicjson import write_json_atomic
from ferry.runtime.control import MAX_REQUEST_BYTES, ControlInbox
from ferry.runtime.jobdir import JobDir, read_json
from ferry.runtime.jobfiles import Answer
from ferry.runtime.warmstart import ENV, GO, READY, WarmFds
from ferry.supervisor.worker import WorkerGroup

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("ferry.run")
PREFIX = "warm-"


@dataclass(frozen=True)
class WarmRequest:
    id: str
    env: dict[str, str]
    expires: float
    """Seconds after which a warm worker that has not taken over is discarded (its migration
    gave up or died)."""


class WarmRequestDoc(TypedDict):
    """``control/warm-<id>.json`` as ``ferry migrate`` writes it (``submit``)."""

    id: str
    created: float
    uid: int
    """Informational: the supervisor trusts the file's owner, not what the file says."""
    env: dict[str, str]
    expires: float


def submit(job: JobDir, env: Mapping[str, str], *, expires: float) -> str:
    """Ask the job's supervisor for a warm worker with ``env``; returns the request id."""
    rid = uuid.uuid4().hex[:12]
    doc = WarmRequestDoc(id=rid, created=time.time(), uid=os.getuid(), env=dict(env), expires=expires)
    try:
        write_json_atomic(os.path.join(job.control, f"{PREFIX}{rid}.json"), doc)
    except PermissionError as exc:
        raise JobError(f"cannot write to {job.control}: only the job's own user may control it") from exc
    return rid


def take_requests(job: JobDir) -> list[WarmRequest | tuple[str, str]]:
    """The pending warm requests (read and removed); a refused one comes as (id, why)."""
    try:
        entries = list(os.scandir(job.control))
    except FileNotFoundError:
        return []
    out: list[WarmRequest | tuple[str, str]] = []
    uid = os.getuid()
    for entry in entries:
        if not (entry.name.startswith(PREFIX) and entry.name.endswith(".json")):
            continue
        rid = entry.name[len(PREFIX) : -5]
        try:
            st = entry.stat(follow_symlinks=False)
            if st.st_uid != uid or not stat.S_ISREG(st.st_mode):
                raise ValueError("not a regular file of the job's own user")
            raw = read_json(entry.path, MAX_REQUEST_BYTES, owner=uid)
        except (OSError, ValueError) as exc:
            out.append((rid, f"warm start refused: {exc}; nothing was done"))
        else:
            env = raw.get("env") if isinstance(raw, dict) else None
            expires = raw.get("expires") if isinstance(raw, dict) else None
            good_env = isinstance(env, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()
            )
            good_expiry = isinstance(expires, (int, float)) and 0 < expires < float("inf")
            if good_env and good_expiry:
                if not isinstance(env, dict) or not isinstance(expires, (int, float)):
                    raise bug("a warm request passed its checks with fields of other types")
                out.append(WarmRequest(rid, dict(env), float(expires)))
            else:
                out.append((rid, "warm start refused: malformed env or expiry; nothing was done"))
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
    return out


class WarmGate(Protocol):
    """What a job's first worker waits for when it starts warm (``ferry resume --warm``: the
    state is still on another node). The supervisor starts the worker warm, then calls:

    1. ``ready(pid, seconds)`` once, when the worker waits at its restore point;
    2. ``poll()`` every 50 ms until it answers: None to wait on, "" when the state is in place
       (the worker is released), or why the job cannot start (the worker is discarded and
       the run ends failed with that message);
    3. ``settled(job)`` at each of its wake-ups after the release, until it returns True
       (it reports the move's downtime once the worker trained its first steps).
    """

    def ready(self, pid: int, seconds: float) -> None: ...
    def poll(self) -> str | None: ...
    def settled(self, job: JobDir) -> bool: ...


def answer(job: JobDir, rid: str, *, ok: bool, **fields: Unpack[Answer]) -> None:
    ControlInbox(job).respond(rid, ok=ok, **fields)


class WarmWorker:
    """The second worker of a migration: started now, released (``go``) or ended (``discard``)
    later. Its stdout and stderr are buffers (unlinked temporary files) until it takes over."""

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        *,
        locks: tuple[int, ...],
        rid: str,
        expires: float,
    ) -> None:
        self.rid = rid
        self.started = time.time()
        self.expires = self.started + expires
        self.ready_at: float | None = None
        go_r, self._go = os.pipe()
        self._ready, ready_w = os.pipe()
        os.set_blocking(self._ready, False)
        # The buffers live as long as the warm worker, not a block: closed by go() or discard().
        self._out = tempfile.TemporaryFile()  # noqa: SIM115
        self._err = tempfile.TemporaryFile()  # noqa: SIM115
        real_out, real_err = os.dup(1), os.dup(2)
        mine = (go_r, ready_w, real_out, real_err)
        fds = WarmFds(go=go_r, ready=ready_w, out=real_out, err=real_err)
        try:
            self.group = WorkerGroup(
                command,
                {**env, ENV: fds.to_env()},
                locks=(*locks, *mine),
                pdeathsig=signal.SIGKILL,  # it has nothing to save: it never trained
                stdout=self._out.fileno(),
                stderr=self._err.fileno(),
            )
        except BaseException:
            self._close(self._go, self._ready)
            raise
        finally:
            self._close(*mine)
        self.pid = self.group.pid

    @staticmethod
    def _close(*fds: int) -> None:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def poll_ready(self) -> bool:
        """True once it waits at its restore point."""
        if self.ready_at is None:
            try:
                if os.read(self._ready, 1) == READY:
                    self.ready_at = time.time()
            except BlockingIOError:
                pass
            except OSError:
                return False
        return self.ready_at is not None

    def exited(self) -> int | None:
        return self.group.poll()

    def go(self) -> bool:
        """Let it take over; False when it is gone (it cannot)."""
        if self.exited() is not None:
            return False
        try:
            os.write(self._go, GO)
        except OSError:
            return False
        finally:
            self._close(self._go, self._ready)
            self._out.close()
            self._err.close()
        return True

    def discard(self) -> None:
        """End it: it wrote nothing of the job, so SIGKILL leaves nothing half done."""
        self._close(self._go, self._ready)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.group.proc.wait(5.0)
        self.group.clear()
        self._out.close()
        self._err.close()

    def last_words(self) -> str:
        """The last line it printed to stderr, for the error that says why it ended."""
        try:
            self._err.seek(0, os.SEEK_END)
            size = self._err.tell()
            self._err.seek(max(0, size - 4096))
            lines = self._err.read().decode(errors="replace").strip().splitlines()
        except (OSError, ValueError):
            return ""
        return lines[-1].strip() if lines else ""
