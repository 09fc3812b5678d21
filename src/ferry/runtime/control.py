"""The control channel: request files in the job directory, answered by the worker.

A controller drops ``control/req-<id>.json`` (written to a temporary name, then renamed);
the worker picks requests up at its next safe point and answers with
``control/resp-<id>.json``. Only requests owned by the job's own user are obeyed: the
directory is 0700, and the worker checks each file's owner anyway. A request is parsed
whole (``RequestDoc``) before the worker acts on it: one that is not a small regular file
of well-typed fields is refused, answered and logged, never raised into the training loop,
and then removed (or, when it cannot be, set aside under another name or remembered), so
that it is answered once, not at every poll.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from ferry.errors import JobError
from ferry.runtime.atomicjson import write_json_atomic
from ferry.runtime.jobdir import JobDir, read_json
from ferry.runtime.jobfiles import Answer, Response, parse_response
from ferry.typedjson import SchemaError, parse

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("ferry")

ACTIONS = ("checkpoint", "stop", "restart")
"""checkpoint: save and go on. stop: save and exit with the checkpoint code. restart: save,
exit, and have the supervisor (``ferry run``) start the worker again in place, with the
request's ``env`` applied (e.g. another CUDA_VISIBLE_DEVICES)."""

MAX_REQUEST_BYTES = 64 << 10
"""A request is a few hundred bytes; the limit leaves room for a big ``env``."""


class RequestDoc(TypedDict, total=False):
    """``control/req-<id>.json`` as a controller writes it (``submit``)."""

    id: str
    action: str
    created: float
    uid: int
    """Informational: the worker trusts the file's owner, not what the file says."""
    env: dict[str, str] | None


@dataclass(frozen=True)
class Request:
    id: str
    action: str
    created: float
    env: dict[str, str] | None = None


def parse_request(rid: str, raw: object) -> Request:
    """The request ``rid`` from its decoded file; JobError, naming the field, if it is not
    one the worker may act on (the worker then answers with that error and does nothing)."""
    try:
        doc = parse(raw, RequestDoc)
    except SchemaError as exc:
        why = "it is not a JSON object" if not exc.field else f"malformed {exc}"
        raise JobError(f"request {rid} refused: {why}; nothing was done") from None
    action = doc.get("action")
    if action not in ACTIONS:
        raise JobError(f"unknown action {action!r}")
    return Request(rid, action, doc.get("created", 0.0), doc.get("env"))


def submit(job: JobDir, action: str, env: dict[str, str] | None = None) -> str:
    """Drop a request; returns its id."""
    if action not in ACTIONS:
        raise JobError(f"unknown control action {action!r}; use one of {', '.join(ACTIONS)}")
    rid = uuid.uuid4().hex[:12]
    try:
        doc = RequestDoc(id=rid, action=action, created=time.time(), uid=os.getuid(), env=env or {})
        write_json_atomic(_request_path(job, rid), doc)
    except PermissionError as exc:
        raise JobError(f"cannot write to {job.control}: only the job's own user may control it") from exc
    return rid


def _request_path(job: JobDir, rid: str) -> str:
    return os.path.join(job.control, f"req-{rid}.json")


def pending_action(job: JobDir, rid: str) -> str | None:
    """The action of request ``rid`` while no worker has taken it; None once taken (or when
    it cannot be read: a controller asks only about its own requests)."""
    try:
        raw = read_json(_request_path(job, rid))
    except (OSError, ValueError):
        return None
    action = raw.get("action") if isinstance(raw, dict) else None
    return action if isinstance(action, str) else None


def withdraw(job: JobDir, rid: str) -> None:
    """Remove a request no worker will take (its job ended)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_request_path(job, rid))


def response_path(job: JobDir, rid: str) -> str:
    return os.path.join(job.control, f"resp-{rid}.json")


def read_response(job: JobDir, rid: str) -> Response | None:
    """The worker's answer to ``rid``, or None while there is none; JobError when it is not
    an answer."""
    path = response_path(job, rid)
    try:
        raw = read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise JobError(f"cannot read the answer to request {rid}: {exc}") from None
    return parse_response(raw, path)


def wait_response(
    job: JobDir, rid: str, timeout: float | None, alive: Callable[[], bool] | None = None
) -> Response:
    """Wait for the worker's answer to request ``rid``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        answer = read_response(job, rid)
        if answer is not None:
            return answer
        if alive is not None and not alive():
            raise JobError(f"the job's worker exited before answering request {rid}")
        if deadline is not None and time.monotonic() > deadline:
            raise JobError(
                f"no answer to request {rid} within {timeout:g} s; the job may be "
                "between safe points (a long step) - retry with a longer --timeout"
            )
        time.sleep(0.05)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    return "a device or socket"


class ControlInbox:
    """The worker's side: collect pending requests, answer them."""

    def __init__(self, job: JobDir) -> None:
        self.job = job
        self.uid = os.getuid()
        self._stuck: set[tuple[str, int]] = set()
        """Refused entries (name, inode) that could be neither removed nor set aside."""

    def poll(self) -> list[Request]:
        if not self.job.writer:  # rank 0 reads requests; the ranks then agree
            return []
        requests = []
        try:
            entries = list(os.scandir(self.job.control))
        except FileNotFoundError:
            return []
        for entry in entries:
            if not (entry.name.startswith("req-") and entry.name.endswith(".json")):
                continue
            rid = entry.name[4:-5]
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if (entry.name, st.st_ino) in self._stuck:
                continue
            request = self._take(rid, entry.path, st)
            if request is not None:
                requests.append(request)
        return sorted(requests, key=lambda r: r.created)

    def _take(self, rid: str, path: str, st: os.stat_result) -> Request | None:
        """Read and delete one request file; answer it at once when it is refused."""
        why: str | None = None
        raw: object = None
        if st.st_uid != self.uid:
            why = f"refused: request owned by uid {st.st_uid}, the job runs as uid {self.uid}"
        elif not stat.S_ISREG(st.st_mode):
            why = f"refused: the request is {_kind(st.st_mode)}, not a regular file; nothing was done"
        else:
            try:
                raw = read_json(path, MAX_REQUEST_BYTES, owner=self.uid)
            except ValueError as exc:  # garbled or oversized: answered, never re-read
                why = f"refused: the request is not readable JSON ({exc}); nothing was done"
            except FileNotFoundError:
                return None  # withdrawn meanwhile
            except OSError as exc:  # unreadable (mode 000), or swapped for a link since the stat
                why = f"refused: the request cannot be read ({exc.strerror or exc}); nothing was done"
        self._dispose(rid, path, st)
        if why is None:
            try:
                return parse_request(rid, raw)
            except JobError as exc:
                why = str(exc)
        log.warning("ferry: control request %s ignored: %s", rid, why)
        self.respond(rid, ok=False, error=why)
        return None

    def _dispose(self, rid: str, path: str, st: os.stat_result) -> None:
        """Remove a request taken (``dispose``); what cannot be is remembered, so that no
        entry is answered twice."""
        exc = dispose(self.job.control, rid, path)
        if exc is not None:
            log.warning("ferry: cannot remove the refused request %s (%s); ignored from now on", path, exc)
            self._stuck.add((os.path.basename(path), st.st_ino))

    def respond(self, rid: str, *, ok: bool, **fields: Unpack[Answer]) -> None:
        doc = Response(id=rid, ok=ok, time=time.time(), **fields)
        with contextlib.suppress(OSError):  # the controller then times out and says so
            write_json_atomic(response_path(self.job, rid), doc)


def dispose(control: str, name: str, path: str) -> OSError | None:
    """Remove the request at ``path``, taken; a folder (which ``unlink`` cannot remove, and
    which may hold anything) is renamed out of the requests' names (``refused-NAME-...`` in
    ``control``) instead. Returns the error when neither works."""
    try:
        os.unlink(path)
        return None
    except FileNotFoundError:
        return None
    except OSError:
        pass
    try:
        os.rename(path, os.path.join(control, f"refused-{name}-{uuid.uuid4().hex[:8]}"))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc
    return None


def answer_left(job: JobDir, why: str | None) -> int:
    """Answer and remove every request in ``job``'s ``control/`` that no worker will take: the
    supervisor's, as a new run of the job starts (``why``: a request that came while the last
    run stopped) and as the job ends (``why`` None: it is stopping). None carries over to the
    next run. At the end, a checkpoint or a stop that the job's stop already did (it ended
    checkpointed, its last checkpoint at the step it stopped) is answered with that checkpoint,
    as the worker answers the requests that overtake its stop; any other is refused, saying so.
    Returns how many were answered."""
    status = job.status()
    state, last = status.get("state", "?"), status.get("last_checkpoint")
    stopped_at = None
    if why is None:
        why = f"the job is stopping ({state}, exit {status.get('exit_code')})"
        if state == "checkpointed" and last is not None and last["step"] == status.get("step"):
            stopped_at = last
    inbox = ControlInbox(job)
    requests = inbox.poll()  # malformed ones are answered (refused) and removed by the poll
    for r in requests:
        if stopped_at is not None and r.action in ("checkpoint", "stop"):
            inbox.respond(r.id, ok=True, step=stopped_at["step"], url=stopped_at["url"],
                          seconds=stopped_at["seconds"])  # fmt: skip
        else:
            log.warning("ferry run: control request %s (%s) not taken: %s", r.id, r.action, why)
            inbox.respond(r.id, ok=False, error=f"{why}; nothing was done for this {r.action} request")
    return len(requests)
