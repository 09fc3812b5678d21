"""``events.jsonl``: one TypedDict per kind of event, the log that appends them, the reader.

Each line is ``time``, ``event`` (the kind) and the fields of that kind, declared once below:
the writer (``EventLog``, a job directory's ``event``) takes exactly those fields, so that a
misspelt one fails the type check instead of being dropped by the reader; the reader's
``Event`` is every kind's fields together (a line of an older or newer ferry may hold any of
them), and what reads one kind takes that kind's TypedDict (ops/report.py). Every field is
optional when read: a malformed one is left out (jobfiles.py says how).
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal, TypedDict, overload

from ferry.runtime.jobfiles import Dropped, salvage_minimums
from ferry.typedjson import SchemaError, loads

if TYPE_CHECKING:
    from typing_extensions import Unpack

MAX_EVENT_BYTES = 64 << 10
"""One line of events.jsonl; the file itself grows with the job's life and is not capped."""


# ------------------------------------------------------------ the supervisor's (ferry run)
class RunStartEvent(TypedDict, total=False):
    supervisor_pid: int
    command: list[str]


class RunEndEvent(TypedDict, total=False):
    state: str
    exit_code: int
    message: str


class WorkerStartEvent(TypedDict, total=False):
    pid: int | None
    restarts: int
    failures: int
    warm: bool
    """The worker was started beside the old one (a warm migration)."""


class WorkerExitEvent(TypedDict, total=False):
    pid: int | None
    returncode: int
    signal: str | None


class RestartEvent(TypedDict, total=False):
    pid: int | None
    reason: str
    """``requested`` (a restart request or a migration) or ``failure`` (a back-off)."""
    downtime_seconds: float
    warm: bool
    env: Mapping[str, str | None]
    step: int | None
    returncode: int
    backoff_seconds: float


class SignalEvent(TypedDict, total=False):
    signal: str | None
    action: str


class GraceKillEvent(TypedDict, total=False):
    signal: str | None
    grace_seconds: float


class WarmStartEvent(TypedDict, total=False):
    pid: int | None
    env: Mapping[str, str | None]


class WarmReadyEvent(TypedDict, total=False):
    pid: int | None
    seconds: float


class WarmDiscardedEvent(TypedDict, total=False):
    pid: int | None
    reason: str


# ------------------------------------------------------------ the worker's session
class TrainingStartEvent(TypedDict, total=False):
    step: int | None


class FirstStepEvent(TypedDict, total=False):
    step: int | None
    seconds: float
    next_seconds: float
    """The length of the second step after a resume (``seconds``: the first's)."""


class CheckpointEvent(TypedDict, total=False):
    step: int | None
    url: str | None
    bytes: int
    seconds: float
    blocking_seconds: float


class CheckpointFailedEvent(TypedDict, total=False):
    step: int | None
    error: str


class ResumeEvent(TypedDict, total=False):
    step: int | None
    url: str | None
    seconds: float


class StopEvent(TypedDict, total=False):
    step: int | None
    url: str | None
    exit_code: int


class StopMissedEvent(TypedDict, total=False):
    signal: str | None
    step: int | None


class FailedEvent(TypedDict, total=False):
    step: int | None
    error: str


class RemoteRetryEvent(TypedDict, total=False):
    step: int | None
    error: str


class RemoteCopyEvent(TypedDict, total=False):
    step: int | None
    url: str | None
    retried: int


class RemoteCopySkippedEvent(TypedDict, total=False):
    step: int | None
    name: str
    reason: str


class RemoteCopyFailedEvent(TypedDict, total=False):
    step: int | None
    name: str
    retried: int
    error: str


class _Stamp(TypedDict):
    time: float
    event: str


class Event(
    _Stamp,
    RunStartEvent,
    RunEndEvent,
    WorkerStartEvent,
    WorkerExitEvent,
    RestartEvent,
    SignalEvent,
    GraceKillEvent,
    WarmStartEvent,
    WarmReadyEvent,
    WarmDiscardedEvent,
    TrainingStartEvent,
    FirstStepEvent,
    CheckpointEvent,
    CheckpointFailedEvent,
    ResumeEvent,
    StopEvent,
    StopMissedEvent,
    FailedEvent,
    RemoteRetryEvent,
    RemoteCopyEvent,
    RemoteCopySkippedEvent,
    RemoteCopyFailedEvent,
    total=False,
):
    """One line of ``events.jsonl`` as read: ``time``, ``event``, and the fields of any kind.
    It is each kind's TypedDict too, so a line can be handed to what takes one kind."""


class EventLog:
    """Appends to a job's ``events.jsonl`` (a job directory's ``event``): one line a call,
    under the job directory's lock, and only while ``writing()`` (rank 0 of a job on many)."""

    def __init__(self, path: str, writing: Callable[[], bool], mutex: threading.Lock) -> None:
        self.path = path
        self._writing = writing
        self._mutex = mutex

    @overload
    def __call__(self, kind: Literal["run_start"], **fields: Unpack[RunStartEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["run_end"], **fields: Unpack[RunEndEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["worker_start"], **fields: Unpack[WorkerStartEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["worker_exit"], **fields: Unpack[WorkerExitEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["restart"], **fields: Unpack[RestartEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["signal"], **fields: Unpack[SignalEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["grace_kill"], **fields: Unpack[GraceKillEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["warm_start"], **fields: Unpack[WarmStartEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["warm_ready"], **fields: Unpack[WarmReadyEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["warm_discarded"], **fields: Unpack[WarmDiscardedEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["training_start"], **fields: Unpack[TrainingStartEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["first_step"], **fields: Unpack[FirstStepEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["checkpoint"], **fields: Unpack[CheckpointEvent]) -> None: ...
    @overload
    def __call__(
        self, kind: Literal["checkpoint_failed"], **fields: Unpack[CheckpointFailedEvent]
    ) -> None: ...
    @overload
    def __call__(self, kind: Literal["resume"], **fields: Unpack[ResumeEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["stop"], **fields: Unpack[StopEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["stop_missed"], **fields: Unpack[StopMissedEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["failed"], **fields: Unpack[FailedEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["remote_retry"], **fields: Unpack[RemoteRetryEvent]) -> None: ...
    @overload
    def __call__(self, kind: Literal["remote_copy"], **fields: Unpack[RemoteCopyEvent]) -> None: ...
    @overload
    def __call__(
        self, kind: Literal["remote_copy_skipped"], **fields: Unpack[RemoteCopySkippedEvent]
    ) -> None: ...
    @overload
    def __call__(
        self, kind: Literal["remote_copy_failed"], **fields: Unpack[RemoteCopyFailedEvent]
    ) -> None: ...

    def __call__(self, kind: str, **fields: object) -> None:
        if not self._writing():
            return
        line = json.dumps({"time": time.time(), "event": kind, **fields}, default=str)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        with self._mutex, os.fdopen(os.open(self.path, flags, 0o600), "a") as f:
            f.write(line + "\n")


def parse_event(raw: object, dropped: Dropped, where: str = "events.jsonl") -> Event | None:
    """One decoded line of ``events.jsonl``; None when it has no valid ``time`` and ``event``."""
    try:
        return salvage_minimums(raw, Event, dropped, where)
    except SchemaError as exc:
        dropped(f"{where}: {exc}; line skipped")
        return None


def read_events(path: str, dropped: Dropped) -> list[Event]:
    """The well-formed lines of the events file ``path``, oldest first; the others are
    skipped (and told to ``dropped``). PermissionError comes through: another user's job."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    except PermissionError:
        raise
    except OSError as exc:
        dropped(f"{path} is unreadable ({exc}); ignored")
        return []
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            dropped(f"{path} is not a regular file; ignored")
            return []
        out = []
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            if len(line) > MAX_EVENT_BYTES:
                dropped(f"{where}: a line of {len(line)} bytes is not ferry's; line skipped")
                continue
            try:
                raw = loads(line)
            except ValueError:  # a torn append (a full disk), or not ferry's (nested too deep)
                dropped(f"{where}: not JSON; line skipped")
                continue
            event = parse_event(raw, dropped, where)
            if event is not None:
                out.append(event)
        return out


__all__ = [
    "MAX_EVENT_BYTES",
    "CheckpointEvent",
    "CheckpointFailedEvent",
    "Event",
    "EventLog",
    "FailedEvent",
    "FirstStepEvent",
    "GraceKillEvent",
    "RemoteCopyEvent",
    "RemoteCopyFailedEvent",
    "RemoteCopySkippedEvent",
    "RemoteRetryEvent",
    "RestartEvent",
    "ResumeEvent",
    "RunEndEvent",
    "RunStartEvent",
    "SignalEvent",
    "StopEvent",
    "StopMissedEvent",
    "TrainingStartEvent",
    "WarmDiscardedEvent",
    "WarmReadyEvent",
    "WarmStartEvent",
    "WorkerExitEvent",
    "WorkerStartEvent",
    "parse_event",
    "read_events",
]
