"""The control channel: request files in the job directory, answered by the worker.

A controller drops ``control/req-<id>.json`` (written to a temporary name, then renamed);
the worker picks requests up at its next safe point and answers with
``control/resp-<id>.json``. Only requests owned by the job's own user are obeyed: the
directory is 0700, and the worker checks each file's owner anyway.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ferry.errors import JobError
from ferry.runtime.jobdir import JobDir, read_json, write_json_atomic

ACTIONS = ("checkpoint", "stop", "restart")
"""checkpoint: save and go on. stop: save and exit with the checkpoint code. restart: save,
exit, and have the supervisor (``ferry run``) start the worker again in place, with the
request's ``env`` applied (e.g. another CUDA_VISIBLE_DEVICES)."""


@dataclass(frozen=True)
class Request:
    id: str
    action: str
    created: float
    env: dict[str, str] | None = None


def submit(job: JobDir, action: str, env: dict[str, str] | None = None) -> str:
    """Drop a request; returns its id."""
    if action not in ACTIONS:
        raise JobError(f"unknown control action {action!r}; use one of {', '.join(ACTIONS)}")
    rid = uuid.uuid4().hex[:12]
    try:
        write_json_atomic(
            os.path.join(job.control, f"req-{rid}.json"),
            {"id": rid, "action": action, "created": time.time(), "uid": os.getuid(), "env": env or {}},
        )
    except PermissionError as exc:
        raise JobError(f"cannot write to {job.control}: only the job's own user may control it") from exc
    return rid


def wait_response(job: JobDir, rid: str, timeout: float | None, alive: Any = None) -> dict[str, Any]:
    """Wait for the worker's answer to request ``rid``."""
    path = os.path.join(job.control, f"resp-{rid}.json")
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if os.path.exists(path):
            doc = read_json(path)
            return doc if isinstance(doc, dict) else {}
        if alive is not None and not alive():
            raise JobError(f"the job's worker exited before answering request {rid}")
        if deadline is not None and time.monotonic() > deadline:
            raise JobError(
                f"no answer to request {rid} within {timeout:g} s; the job may be "
                "between safe points (a long step) - retry with a longer --timeout"
            )
        time.sleep(0.05)


class ControlInbox:
    """The worker's side: collect pending requests, answer them."""

    def __init__(self, job: JobDir) -> None:
        self.job = job
        self.uid = os.getuid()

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
                owner = entry.stat().st_uid
                doc = read_json(entry.path)
            except ValueError:
                doc = None  # garbled: answered below, never re-read
            except OSError:
                continue
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
            if owner != self.uid:
                self.respond(
                    rid,
                    ok=False,
                    error=f"refused: request owned by uid {owner}, the job runs as uid {self.uid}",
                )
                continue
            if not isinstance(doc, dict):
                self.respond(rid, ok=False, error="the request is not a JSON object; nothing was done")
                continue
            action = doc.get("action")
            if action not in ACTIONS:
                self.respond(rid, ok=False, error=f"unknown action {action!r}")
                continue
            env = doc.get("env") if isinstance(doc.get("env"), dict) else None
            requests.append(Request(rid, str(action), float(doc.get("created", 0)), env))
        return sorted(requests, key=lambda r: r.created)

    def respond(self, rid: str, *, ok: bool, **fields: Any) -> None:
        doc = {"id": rid, "ok": ok, "time": time.time(), **fields}
        with contextlib.suppress(OSError):  # the controller then times out and says so
            write_json_atomic(os.path.join(self.job.control, f"resp-{rid}.json"), doc)
