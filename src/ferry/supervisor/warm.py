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

from ferry.errors import JobError
from ferry.runtime.atomicjson import write_json_atomic
from ferry.runtime.control import MAX_REQUEST_BYTES, ControlInbox, dispose
from ferry.runtime.jobdir import JobDir, read_json
from ferry.runtime.jobfiles import Answer
from ferry.runtime.warmstart import ENV, GO, READY, WarmFds
from ferry.supervisor.worker import WorkerGroup
from ferry.typedjson import parse

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("ferry.run")
PREFIX = "warm-"
MAX_EXPIRES = 3 * 366 * 24 * 3600.0
"""The longest a warm worker may wait to take over: ``ferry migrate`` asks for three times
its ``--timeout``, which is at most a year."""


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
    """The pending warm requests (read and removed); a refused one comes as (id, why), and
    its reason is logged. Each is parsed whole (``WarmRequestDoc``) before it is obeyed."""
    try:
        entries = list(os.scandir(job.control))
    except FileNotFoundError:
        return []
    out: list[WarmRequest | tuple[str, str]] = []
    for entry in entries:
        if not (entry.name.startswith(PREFIX) and entry.name.endswith(".json")):
            continue
        rid = entry.name[len(PREFIX) : -5]
        try:
            request = _read(rid, entry.path)
        except FileNotFoundError:
            continue  # withdrawn meanwhile
        if isinstance(request, str):
            log.warning("ferry run: warm request %s refused: %s", rid, request)
            out.append((rid, f"warm start refused: {request}; nothing was done"))
        else:
            out.append(request)
        _dispose(job, rid, entry.path)
    return out


def _read(rid: str, path: str) -> WarmRequest | str:
    """The request at ``path``, or why it is refused: it must be a small regular JSON file of
    this user's that ``WarmRequestDoc`` parses, its env one that a process can be given, its
    expiry at most ``MAX_EXPIRES``."""
    uid = os.getuid()
    try:
        st = os.lstat(path)
        if st.st_uid != uid:
            return f"the request is owned by uid {st.st_uid}, the job runs as uid {uid}"
        if not stat.S_ISREG(st.st_mode):
            return "the request is not a regular file"
        doc = parse(read_json(path, MAX_REQUEST_BYTES, owner=uid), WarmRequestDoc)
    except FileNotFoundError:
        raise
    except OSError as exc:  # unreadable, or swapped for a link since the lstat
        return f"the request cannot be read ({exc.strerror or exc})"
    except ValueError as exc:  # not JSON, too big, too deep, or a field of the wrong type
        return f"the request is malformed ({exc})"
    for key, value in doc["env"].items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            return f"env holds {key[:40]!r}, which no process environment can hold"
    if not 0 < doc["expires"] <= MAX_EXPIRES:
        return f"expires is {doc['expires']:g} s, not within (0, {MAX_EXPIRES:g}]"
    return WarmRequest(rid, dict(doc["env"]), doc["expires"])


def _dispose(job: JobDir, rid: str, path: str) -> None:
    """Remove a request taken (``control.dispose``): a folder is renamed out of the
    requests' names, so that it is answered once, not at each wake-up."""
    exc = dispose(job.control, f"{PREFIX}{rid}", path)
    if exc is not None:
        log.warning("ferry run: cannot remove the refused warm request %s (%s)", path, exc)


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
