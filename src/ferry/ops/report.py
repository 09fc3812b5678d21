"""A job's life as data: training steps over wall time, each worker's start-up, checkpoints
and their durations, stops, resumes, failures, migrations and the work lost to failures.

A job is followed across its runs: every run that wrote the same checkpoint root is the
same lineage (``lineage``), whatever its job id (an older ``HOST-PID`` one, another
``--job-id``), so that a job stopped and run again is one report on one time axis.
The data comes from ``events.jsonl`` and ``status.json`` (docs/jobs.md). Steps are known at
checkpoints, stops, resumes and the last status, so the step curve joins those points.
``build`` is pure: what it needs from storage (which checkpoints still exist) comes in as a
function. The figure is drawn from a ``Timeline`` in figure.py; the page here embeds it.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from ferry.errors import FerryError
from ferry.knobs import CHECKPOINT_EXIT_CODE
from ferry.ops.jobs import JobRecord
from ferry.runtime.events import Event
from ferry.runtime.jobfiles import Status
from ferry.storage import open_storage, strategy_for

MarkKind = Literal["stop", "resume", "failure", "migration"]

COLORS: dict[str, str] = {
    "curve": "#1f77b4",
    "checkpoint": "#2ca02c",
    "deleted": "#7f7f7f",
    "stop": "#ff7f0e",
    "resume": "#8c564b",
    "failure": "#d62728",
    "migration": "#9467bd",
    "startup": "#bcbd22",
    "down": "#c7c7c7",
    "overlap": "#17becf",
}


class Mark(TypedDict):
    """An instant the job was interrupted or moved."""

    kind: MarkKind
    time: float
    text: str


class Saved(TypedDict):
    """A checkpoint, from its event; ``deleted`` once retention (or a person) removed it."""

    step: int
    time: float
    seconds: float
    blocking_seconds: float
    url: str | None
    deleted: bool


class Span(TypedDict):
    """A stretch of wall time: a worker's start-up, or work lost to a failure."""

    start: float
    end: float


@dataclass
class Timeline:
    job: str
    segments: list[list[tuple[float, int]]] = field(default_factory=list)
    """(time, step) points of each worker's life."""
    checkpoints: list[Saved] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    startups: list[Span] = field(default_factory=list)
    """From a worker's start to its first known step: process start, imports and restore."""
    lost: list[Span] = field(default_factory=list)
    """From the last checkpoint to a failure: work done twice."""
    down: list[Span] = field(default_factory=list)
    """Not training, between workers: from a worker's stop (its checkpoint committed; it then
    exits) or, without one, its exit, to the next worker's start (a restart's downtime, a
    back-off, or the job stopped until someone ran it again)."""
    last_status: tuple[float, int] | None = None
    """The last point of the curve when it comes from ``status.json`` (the step when the
    status was last written): the steps between the last event and it were not recorded."""
    overlaps: list[Span] = field(default_factory=list)
    """A warm migration's target worker starting up while the old one trained: from its start
    to its take-over (or its end, when it was discarded)."""
    start: float = 0.0
    end: float = 1.0
    runs: int = 0
    """``ferry run`` invocations of the job (its reruns after a stop included)."""

    @property
    def lost_seconds(self) -> float:
        return sum(s["end"] - s["start"] for s in self.lost)

    @property
    def max_step(self) -> int:
        return max([1, *(s for seg in self.segments for _, s in seg)])


def checkpoint_codes(events: Iterable[Event], status: Status) -> set[int]:
    """Exit statuses that mean "checkpointed, resume me" for this job: the default, and the
    one its session and supervisor recorded (``ferry run --exit-code``, HTCondor's
    ``CheckpointExitCode``), so a custom code is drawn as a checkpoint, not a failure."""
    codes = {0, CHECKPOINT_EXIT_CODE}
    for e in events:
        code = e.get("exit_code")
        if isinstance(code, int) and (e["event"] == "stop" or e.get("state") == "checkpointed"):
            codes.add(code)
    code = status.get("exit_code")
    if status.get("state") == "checkpointed" and isinstance(code, int):
        codes.add(code)
    return codes


def build(
    job_id: str, events: list[Event], status: Status, exists: Callable[[str], bool] | None = None
) -> Timeline:
    """The timeline of a job; ``exists(url)`` tells whether a checkpoint is still on storage."""
    tl = Timeline(job_id)
    ok_codes = checkpoint_codes(events, status)
    current: list[tuple[float, int]] = []
    started: float | None = None  # the worker's start, while it has not trained yet
    restored: float | None = None  # its restore, when it resumed
    last_ckpt: float | None = None
    last_stop: int | None = None  # the index of the stop mark a requested restart may follow
    exited: float | None = None  # the last worker's stop or exit, while no other worker started
    stopped: float | None = None  # this worker's stop, while it exits
    pid: object = None  # the current worker's
    warming: dict[object, float] = {}  # warm workers started and not yet taken over: pid -> start
    rerun = False  # a run of the job started, and has not resumed or trained yet

    def trained(end: float | None) -> None:
        """The start-up of the worker ends at ``end``; None: unknown (an older worker that
        wrote no ``training_start``, and no restore or step-0 save): trained from its start."""
        nonlocal started, restored
        if started is not None:
            if end is None:
                current.insert(0, (started, 0))
            else:
                tl.startups.append({"start": started, "end": end})
        started = restored = None

    for e in sorted(events, key=lambda e: e["time"]):
        t, kind, step = e["time"], e["event"], e.get("step")
        if kind == "warm_start":
            warming[e.get("pid")] = t
        if kind in ("warm_discarded", "worker_start") and e.get("pid") in warming:
            tl.overlaps.append({"start": warming.pop(e.get("pid")), "end": t})
        if kind == "worker_exit" and None not in (e.get("pid"), pid) and e.get("pid") != pid:
            kind = "retired"  # the worker a warm one took over from: the current one lives on
        if kind in ("run_start", "resume", "training_start", "checkpoint"):
            last_stop = None  # a new run, or the next worker at work: no restart pending
        if kind == "run_start":
            tl.runs += 1
            rerun = tl.runs > 1
        elif kind == "resume" and rerun and isinstance(step, int):
            tl.marks.append({"kind": "resume", "time": t, "text": f"run again: resumed at step {step}"})
        if kind in ("resume", "training_start", "checkpoint"):
            rerun = False
        if kind == "stop":
            stopped = t
        if kind == "worker_exit":
            exited, stopped = (stopped if stopped is not None else t), None
        if kind == "worker_start":
            if exited is not None:
                tl.down.append({"start": exited, "end": t})
            exited = stopped = None  # a warm worker took over before the old one exited: no gap
        if kind in ("run_start", "worker_start"):
            pid = e.get("pid")
            trained(restored)
            if current:
                tl.segments.append(current)
            current, started = [], (t if kind == "worker_start" else None)
        if kind == "training_start":  # the first safe point of the worker
            trained(t)
        if kind == "worker_exit" and started is not None and restored is None:
            trained(t)  # it never trained: its whole life was start-up
        if isinstance(step, int) and kind in ("checkpoint", "resume", "stop", "training_start"):
            if kind == "resume":
                restored = t
            elif started is not None:
                trained(restored if restored is not None else (t if step == 0 else None))
            current.append((t, step))
        if kind == "checkpoint" and isinstance(step, int):
            url = e.get("url")
            tl.checkpoints.append(
                {
                    "step": step,
                    "time": t,
                    "seconds": e.get("seconds", 0.0),
                    "blocking_seconds": e.get("blocking_seconds", 0.0),
                    "url": url,
                    "deleted": bool(url and exists is not None and not exists(url)),
                }
            )
            last_ckpt = t
        elif kind == "stop":
            last_stop = len(tl.marks)
            tl.marks.append({"kind": "stop", "time": t, "text": f"stopped at step {step} (checkpointed)"})
        elif kind == "worker_exit" and e.get("returncode") is not None and e["returncode"] not in ok_codes:
            began = last_ckpt if last_ckpt is not None else (current[0][0] if current else t)
            if began < t:
                tl.lost.append({"start": began, "end": t})
            tl.marks.append(
                {
                    "kind": "failure",
                    "time": t,
                    "text": f"worker exited {e['returncode']}: {t - began:.1f} s of work since the last "
                    "checkpoint lost and recomputed",
                }
            )
        elif kind == "restart" and e.get("reason") == "requested":
            env = " ".join(f"{k}={v}" for k, v in e.get("env", {}).items())
            what, who = (
                ("warm hand-over", "the warm worker took over")
                if e.get("warm")
                else ("restarted in place", "the new worker started")
            )
            text = f"{what} {env} (down {e.get('downtime_seconds', 0.0):.2f} s until {who})"
            if last_stop is not None:  # the worker's stop was this migration's: one mark, when it left
                left = tl.marks[last_stop]
                tl.marks[last_stop] = {"kind": "migration", "time": left["time"],
                                       "text": f"{left['text']}, then {text}"}  # fmt: skip
                last_stop = None
            else:
                tl.marks.append({"kind": "migration", "time": t, "text": text})
    if started is not None and restored is None and status.get("state") == "starting":
        tl.startups.append({"start": started, "end": status.get("updated", started)})  # starting now
        started = None
    trained(restored)
    if "updated" in status and "step" in status:
        current.append((status["updated"], status["step"]))
        tl.last_status = current[-1]
    if current:
        tl.segments.append(current)
    times = [e["time"] for e in events] + [t for seg in tl.segments for t, _ in seg]
    if times:
        tl.start, tl.end = min(times), max(max(times), min(times) + 1e-3)
    return tl


def lineage(record: JobRecord, records: Iterable[JobRecord]) -> list[JobRecord]:
    """The runs of ``record``'s job: every job directory (of this user, as listed) whose
    checkpoint root is the same, oldest first. A job stopped and run again under another id
    (an older ``HOST-PID`` default, a new ``--job-id``) still wrote that root."""
    root = record.identity.get("checkpoint_dir")
    same = [r for r in records if root and r.identity.get("checkpoint_dir") == root and r.id != record.id]
    return sorted([record, *same], key=lambda r: float(r.identity.get("created") or 0.0))


def merged(records: list[JobRecord]) -> tuple[list[Event], Status]:
    """The events of every run of a lineage, in time order, and the status of the newest."""
    events = sorted((e for r in records for e in r.dir.events()), key=lambda e: e["time"])
    newest = max(records, key=lambda r: float(r.status.get("updated") or 0.0))
    return events, newest.status


def checkpoint_exists(url: str) -> bool:
    """Whether a committed checkpoint is still on its storage. One that cannot be looked at
    (a remote that is down, no credentials here) counts as there: the report must not call
    a checkpoint deleted that it merely could not see."""
    parent_url, _, name = url.rstrip("/").rpartition("/")
    try:
        parent = open_storage(parent_url)
        return strategy_for(parent).is_committed(parent, name)
    except (FerryError, OSError, ValueError, ImportError):
        return True


def page(tl: Timeline, status: Status, figure_svg: str) -> str:
    """A self-contained HTML page: the summary, the figure as inline SVG, the tables."""
    esc = html.escape
    rows = "".join(
        f"<tr><td>{c['step']}</td><td>{c['time'] - tl.start:.1f}</td>"
        f"<td>{c['seconds']:.3f}</td><td>{c['blocking_seconds']:.3f}</td>"
        f"<td>{esc(str(c['url']))}{' (deleted by retention)' if c['deleted'] else ''}</td></tr>"
        for c in tl.checkpoints
    )
    marks = "".join(
        f'<li style="color:{COLORS[m["kind"]]}">{m["time"] - tl.start:.1f} s: {esc(m["text"])}</li>'
        for m in tl.marks
    )
    saves = [c["seconds"] for c in tl.checkpoints]
    mean = f"{sum(saves) / len(saves):.3f} s" if saves else "-"
    startup = sum(s["end"] - s["start"] for s in tl.startups)
    overlap = sum(s["end"] - s["start"] for s in tl.overlaps)
    count = {k: sum(m["kind"] == k for m in tl.marks) for k in ("failure", "stop", "resume", "migration")}
    deleted = sum(c["deleted"] for c in tl.checkpoints)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>ferry job {esc(tl.job)}</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:2px 8px;text-align:right}}</style>
</head><body>
<h1>ferry job {esc(tl.job)}</h1>
<p>state <b>{esc(str(status.get("state")))}</b> at step {status.get("step")}; wall time
{tl.end - tl.start:.1f} s over {tl.runs} run(s) of the job; {len(tl.checkpoints)} checkpoints (mean save
{mean}; {deleted} since deleted by retention); {count["failure"]} failures, {count["stop"]} stops,
{count["resume"]} resumes, {count["migration"]} migrations; worker start-up {startup:.1f} s (and
{overlap:.1f} s of warm workers' start-up while the job trained); work lost and recomputed:
{tl.lost_seconds:.1f} s of wall time.</p>
{figure_svg}
<h2>Events</h2><ul>{marks or "<li>no interruption</li>"}</ul>
<h2>Checkpoints</h2>
<table><tr><th>step</th><th>at (s)</th><th>save (s)</th><th>blocked (s)</th><th>url</th></tr>{rows}</table>
</body></html>
"""
