"""The documents of a job directory (docs/jobs.md), declared once and parsed where they are read.

``job.json``, ``status.json`` and each line of ``events.jsonl`` (declared in events.py) are
rewritten or appended while other processes read them, by writers of several versions: a reader takes what it
can. A field of the wrong type is left out (and reported to ``dropped``, which logs it), a
line that is not an event is skipped; nothing malformed reaches the code that uses them,
and nothing malformed raises into it either. A control answer (``resp-<id>.json``) is
read once, by the controller that waits for it: a malformed one is a ``JobError``.
Control requests are parsed in control.py, next to the inbox that obeys them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypedDict, TypeVar, get_args

from ferry.errors import JobError
from ferry.typedjson import SchemaError, parse, salvage

State = Literal["starting", "running", "checkpointing", "checkpointed", "resumed", "finished", "failed"]
STATES: tuple[State, ...] = get_args(State)

Dropped = Callable[[str], None]
"""Told, in one line, about each field (or line) that was left out."""


class Identity(TypedDict, total=False):
    """``job.json``: who runs the job. Written by the supervisor, the worker's session, or both."""

    id: str
    host: str
    uid: int
    created: float
    user: str
    cwd: str
    command: list[str]
    argv: list[str]
    checkpoint_dir: str
    supervisor_pid: int | None
    worker_pid: int | None
    pid: int
    scheduler: str
    scheduler_restarts: int
    node: str
    """A job on many nodes: this node's name (``node<rank>``, or its host), written by its
    supervisor; the job directory is then ``<id>@<node>``."""
    nodes: int
    """A job on many nodes: how many (at most)."""


class CheckpointRecord(TypedDict):
    """A committed checkpoint, as ``status.json`` keeps it (and the ``checkpoint`` event)."""

    step: int
    url: str
    bytes: int
    seconds: float
    blocking_seconds: float
    time: float


class Saving(TypedDict):
    """``status.json``'s ``saving``: the save in flight, once it has run a second
    (session/savewatch.py); removed when it ends."""

    step: int
    bytes: int
    """Written so far."""
    total: int
    started: float
    """``time.time()`` when the save began writing."""


class StatusUpdate(TypedDict, total=False):
    """What an update of ``status.json`` (``JobDir.update_status``) may set beside the state."""

    step: int
    pid: int
    worker_pid: int | None
    supervisor_pid: int | None
    resumed_from: str
    url: str
    exit_code: int | None
    error: str | None
    restart: dict[str, str] | None
    """After a ``restart`` request: the env to start the worker again with."""
    started: float
    ended: float
    worker_started: float
    restarts: int
    max_restarts: int
    failures: int


class Status(StatusUpdate, total=False):
    """``status.json``: how far the job got. Every field is optional: it grows by updates
    (``StatusUpdate``, with the state), committed checkpoints (``CheckpointRecord``) and the
    save in flight (``Saving``), each written by its own ``JobDir`` method."""

    state: State
    updated: float
    last_checkpoint: CheckpointRecord
    checkpoints: list[CheckpointRecord]
    saving: Saving


class _ResponseBase(TypedDict):
    id: str
    ok: bool


class Answer(TypedDict, total=False):
    """What a worker (``ControlInbox.respond``) or a supervisor (a warm start's answer) says
    beside ``ok``: with ``ok``, the checkpoint it took; without, the error."""

    step: int
    url: str
    seconds: float
    error: str
    pid: int
    """A warm start's answer (supervisor/warm.py): the warm worker's pid."""


class Response(_ResponseBase, Answer, total=False):
    """``control/resp-<id>.json``: the answer, with the time it was written."""

    time: float


MINIMUM = {"pid": 1, "worker_pid": 1, "supervisor_pid": 1, "uid": 0}
"""Integer fields with a floor: a controller signals pids and looks them up in /proc, where 0
or less would address a process group or every process."""

D = TypeVar("D")


def salvage_minimums(raw: object, schema: type[D], dropped: Dropped, where: str) -> D:
    """``typedjson.salvage``, integer fields under their floor (``MINIMUM``) left out too."""
    if isinstance(raw, dict):
        low = [k for k, floor in MINIMUM.items() if type(raw.get(k)) is int and raw[k] < floor]
        for key in low:
            dropped(f"{where}: {key}: {raw[key]} is out of range; left out")
        raw = {k: v for k, v in raw.items() if k not in low}
    return salvage(raw, schema, lambda exc: dropped(f"{where}: {exc}; left out"))


def parse_identity(raw: object, dropped: Dropped, where: str = "job.json") -> Identity:
    """What can be taken from a decoded ``job.json``; {} if it is not an object."""
    try:
        return salvage_minimums(raw, Identity, dropped, where)
    except SchemaError as exc:
        dropped(f"{where}: {exc.why}; ignored")
        return {}


def saving_problem(saving: Saving) -> str | None:
    """Why a well-typed ``saving`` cannot be a save in flight (None when it can): a reader
    draws it and divides by its numbers."""
    if min(saving["step"], saving["bytes"], saving["total"]) < 0:
        return "a count below 0"
    if saving["bytes"] > saving["total"]:
        return f"{saving['bytes']} bytes written of {saving['total']}"
    if saving["started"] <= 0:
        return f"started at {saving['started']}"
    return None


def parse_status(raw: object, dropped: Dropped, where: str = "status.json") -> Status:
    """What can be taken from a decoded ``status.json``; {} if it is not an object."""
    try:
        status = salvage_minimums(raw, Status, dropped, where)
    except SchemaError as exc:
        dropped(f"{where}: {exc.why}; ignored")
        return {}
    saving = status.get("saving")
    problem = None if saving is None else saving_problem(saving)
    if problem is not None:
        dropped(f"{where}: saving: {problem}; left out")
        del status["saving"]
    return status


def parse_response(raw: object, where: str) -> Response:
    """A decoded answer; JobError, naming the field, when it is not one."""
    try:
        return parse(raw, Response)
    except SchemaError as exc:
        raise JobError(f"{where} is not a ferry answer ({exc}): was it written by hand?") from None


__all__ = [
    "STATES",
    "Answer",
    "CheckpointRecord",
    "Dropped",
    "Identity",
    "Response",
    "Saving",
    "State",
    "Status",
    "StatusUpdate",
    "parse_identity",
    "parse_response",
    "parse_status",
    "salvage_minimums",
    "saving_problem",
]
