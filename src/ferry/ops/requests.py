"""Control requests to a running job: send one after the checks (``send``), wait for the
worker's answer (``wait_answer``) while drawing its save in flight (``SaveLine``), and say
why none came. The job is found first (``ferry.ops.jobs``); the files are those of
docs/jobs.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypedDict

from ferry.errors import JobError
from ferry.knobs import (
    ANSWER_CHECK_SECONDS,
    ANSWER_FIRST_NOTE_SECONDS,
    ANSWER_NOTE_SECONDS,
    PROCESS_POLL_SECONDS,
)
from ferry.ops.jobs import JobRecord
from ferry.progress import Meter
from ferry.runtime.control import pending_action, read_response, response_path, submit, withdraw
from ferry.runtime.jobfiles import Response, Saving


def require_alive(record: JobRecord, doing: str) -> None:
    uid = record.uid
    if uid is not None and uid != os.getuid():
        raise JobError(
            f"refused: job {record.id} runs as uid {uid}, you are uid {os.getuid()}; "
            "only the job's own user may control it"
        )
    if not record.alive:
        pid = record.worker_pid
        why = f"its worker (pid {pid}) is gone" if pid else "it has no worker"
        raise JobError(
            f"cannot {doing} job {record.id}: it is not running ({record.state}; {why}); "
            "`ferry resume` or `ferry run` starts it again from its last checkpoint"
        )


def send(record: JobRecord, action: str, env: dict[str, str] | None = None) -> str:
    """Drop a control request after the checks; returns the request id.

    A job that is checkpointing (``BUSY_STATES``) is not refused: its worker takes the
    request at the first safe point after the save in flight, so a preemption hook's
    ``checkpoint --all --wait`` queues behind a periodic save instead of failing. A stop
    already under way answers the requests that came in meanwhile with its own checkpoint
    (session/reporting.py), and ``wait_answer`` joins one that ended before it could."""
    require_alive(record, action)
    if action == "restart" and record.identity.get("node") is not None:
        raise JobError(
            f"cannot restart job {record.id} in place: it runs on {record.identity.get('nodes')} nodes, "
            "and one node's supervisor cannot start the others again; stop it (`ferry checkpoint "
            "--stop`) and start it again on its nodes: it resumes from that checkpoint"
        )
    return submit(record.dir, action, env)


def _joined_stop(record: JobRecord, rid: str) -> Response | None:
    """The answer to a checkpoint or stop request that a stop overtook: the worker committed
    a checkpoint and exited before it took the request, so the job's newest state is saved,
    which is what the request asked for. None for any other request, or any other end."""
    action = pending_action(record.dir, rid)
    status = record.status
    last = status.get("last_checkpoint")
    if action not in ("checkpoint", "stop") or status.get("state") != "checkpointed" or last is None:
        return None
    if last["step"] != status.get("step"):
        return None
    withdraw(record.dir, rid)
    return {"id": rid, "ok": True, "step": last["step"], "url": last["url"], "seconds": last["seconds"],
            "time": last["time"]}  # fmt: skip


class SaveInFlight(TypedDict):
    """The worker's save in flight, as ``ferry status`` shows it (``--json`` too)."""

    step: int
    bytes: int
    total: int
    started: float
    seconds: float
    bytes_per_second: float


def save_in_flight(record: JobRecord, now: float | None = None) -> SaveInFlight | None:
    """The save its worker is writing (status ``saving``) with its throughput so far; None
    when there is none, or when the worker is gone (a field a killed worker left)."""
    saving = record.status.get("saving")
    if saving is None or not record.alive:
        return None
    seconds = max((time.time() if now is None else now) - saving["started"], 0.0)
    rate = saving["bytes"] / seconds if seconds > 0 else 0.0
    return {**saving, "seconds": seconds, "bytes_per_second": rate}


class SaveLine:
    """The worker's save in flight (its status' ``saving``), drawn on a ``Meter`` while a
    command waits for it: one line per save, from the bytes the worker published."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self._started: float | None = None  # the save drawn now, by its start
        self._done = self._total = 0

    @property
    def drawn(self) -> bool:
        return self._started is not None

    def show(self, saving: Saving | None) -> None:
        if saving is None or saving["started"] != self._started:
            self.end(complete=False)  # that save ended (or failed: its answer says so)
        if saving is None:
            return
        if self._started is None:
            self._started, self._done, self._total = saving["started"], 0, saving["total"]
            elapsed = time.time() - saving["started"]
            self.meter.start(f"saving step {saving['step']}", saving["total"], elapsed=elapsed)
        # At every poll, new bytes or none: the meter redraws (throughput, time left) at its pace.
        self.meter.advance(max(saving["bytes"] - self._done, 0))
        self._done = max(saving["bytes"], self._done)

    def end(self, *, complete: bool) -> None:
        """The line stays as the save's last state; ``complete``: it was committed."""
        if self._started is None:
            return
        if complete and self._total > self._done:
            self.meter.advance(self._total - self._done)
        self.meter.finish()
        self._started = None


def wait_answer(
    record: JobRecord,
    rid: str,
    timeout: float | None,
    progress: Callable[[str], None] | None = None,
    meter: Meter | None = None,
) -> Response:
    """The worker's answer to ``rid``; JobError when it refuses, fails, dies or times out.
    ``meter``: draws the worker's save in flight meanwhile (``SaveLine``)."""
    line = None if meter is None else SaveLine(meter)
    try:
        return _wait_answer(record, rid, timeout, progress, line)
    finally:
        if line is not None:
            line.end(complete=False)


def _wait_answer(
    record: JobRecord,
    rid: str,
    timeout: float | None,
    progress: Callable[[str], None] | None,
    line: SaveLine | None,
) -> Response:
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    next_note, next_check = start + ANSWER_FIRST_NOTE_SECONDS, start
    while True:
        doc = read_response(record.dir, rid)
        if doc is not None:
            if line is not None:
                line.end(complete=doc["ok"])
            if not doc["ok"]:
                raise JobError(f"job {record.id}: {doc.get('error', 'the request failed')}")
            return doc
        if line is not None:
            line.show(record.dir.status().get("saving"))
        now = time.monotonic()
        if now >= next_check:
            next_check = now + ANSWER_CHECK_SECONDS
            if not record.refresh().alive and not os.path.exists(response_path(record.dir, rid)):
                if line is not None:
                    line.end(complete=False)
                joined = _joined_stop(record, rid)
                if joined is not None:
                    return joined
                raise JobError(
                    f"job {record.id}'s worker exited before answering (state {record.state}); "
                    "no checkpoint was committed for this request"
                )
        if deadline is not None and now > deadline:
            raise JobError(no_answer_message(record.refresh(), timeout))
        if progress is not None and now >= next_note:
            if line is None or not line.drawn:  # the line says more, and a note would break it
                progress(
                    f"job {record.id}: waiting ({now - start:.0f} s, step {record.dir.status().get('step')})"
                )
            next_note = now + ANSWER_NOTE_SECONDS
        time.sleep(PROCESS_POLL_SECONDS)


def no_answer_message(record: JobRecord, timeout: float | None) -> str:
    """Why a request went unanswered, as far as the job directory tells."""
    within = f"job {record.id} did not answer within {timeout:g} s"
    if record.session_pid is None:
        # only the supervisor wrote: no ferry session runs in the worker to take requests
        return (
            f"{within}: its worker (pid {record.worker_pid}) has not started a ferry session "
            f"(state {record.status.get('state', '?')}): it is still starting up, or its script does "
            "not use ferry (under --no-autotrack, only ferry's API answers); the request stays "
            "queued for the session's first safe point"
        )
    return (
        f"{within} (at step {record.status.get('step')}): a long step delays the next safe "
        "point; retry with a longer --timeout"
    )
