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
from ferry.runtime.events import (
    CheckpointEvent,
    Event,
    RestartEvent,
    ResumeEvent,
    RunStartEvent,
    StopEvent,
    TrainingStartEvent,
    WarmDiscardedEvent,
    WarmStartEvent,
    WorkerExitEvent,
    WorkerStartEvent,
)
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


class _Builder:
    """The timeline, built one event at a time: one method per kind of event that draws
    something (``build`` dispatches), and what the job's workers were doing so far."""

    def __init__(self, tl: Timeline, ok_codes: set[int], exists: Callable[[str], bool] | None) -> None:
        self.tl, self.ok_codes, self.exists = tl, ok_codes, exists
        self.current: list[tuple[float, int]] = []
        self.started: float | None = None  # the worker's start, while it has not trained yet
        self.restored: float | None = None  # its restore, when it resumed
        self.last_ckpt: float | None = None
        self.last_stop: int | None = None  # the index of the stop mark a requested restart may follow
        self.exited: float | None = None  # the last worker's stop or exit, while no other worker started
        self.stopped: float | None = None  # this worker's stop, while it exits
        self.pid: int | None = None  # the current worker's
        self.warming: dict[int | None, float] = {}  # warm workers not yet taken over: pid -> start
        self.rerun = False  # a run of the job started, and has not resumed or trained yet

    def trained(self, end: float | None) -> None:
        """The start-up of the worker ends at ``end``; None: unknown (an older worker that
        wrote no ``training_start``, and no restore or step-0 save): trained from its start."""
        if self.started is not None:
            if end is None:
                self.current.insert(0, (self.started, 0))
            else:
                self.tl.startups.append({"start": self.started, "end": end})
        self.started = self.restored = None

    def new_worker(self, t: float, pid: int | None, started: float | None) -> None:
        """A run of the job, or a worker of it, starts: the last one's curve ends."""
        self.pid = pid
        self.trained(self.restored)
        if self.current:
            self.tl.segments.append(self.current)
        self.current, self.started = [], started

    def at_step(self, t: float, step: int) -> None:
        """A checkpoint or a stop at ``step``: a point of the curve, the start-up's end."""
        if self.started is not None:
            self.trained(self.restored if self.restored is not None else (t if step == 0 else None))
        self.current.append((t, step))

    def run_start(self, t: float, e: RunStartEvent) -> None:
        self.last_stop = None  # a new run: no restart pending
        self.tl.runs += 1
        self.rerun = self.tl.runs > 1
        self.new_worker(t, None, None)

    def worker_start(self, t: float, e: WorkerStartEvent) -> None:
        pid = e.get("pid")
        if pid in self.warming:  # a warm worker took over
            self.tl.overlaps.append({"start": self.warming.pop(pid), "end": t})
        if self.exited is not None:
            self.tl.down.append({"start": self.exited, "end": t})
        self.exited = self.stopped = None  # a warm worker took over before the old one exited: no gap
        self.new_worker(t, pid, t)

    def warm_start(self, t: float, e: WarmStartEvent) -> None:
        self.warming[e.get("pid")] = t

    def warm_discarded(self, t: float, e: WarmDiscardedEvent) -> None:
        pid = e.get("pid")
        if pid in self.warming:
            self.tl.overlaps.append({"start": self.warming.pop(pid), "end": t})

    def training_start(self, t: float, e: TrainingStartEvent) -> None:
        """The first safe point of the worker."""
        self.last_stop, self.rerun = None, False
        self.trained(t)
        step = e.get("step")
        if isinstance(step, int):
            self.current.append((t, step))

    def resume(self, t: float, e: ResumeEvent) -> None:
        self.last_stop, step = None, e.get("step")
        if self.rerun and isinstance(step, int):
            self.tl.marks.append({"kind": "resume", "time": t, "text": f"run again: resumed at step {step}"})
        self.rerun = False
        if isinstance(step, int):
            self.restored = t
            self.current.append((t, step))

    def checkpoint(self, t: float, e: CheckpointEvent) -> None:
        self.last_stop, self.rerun, step = None, False, e.get("step")
        if not isinstance(step, int):
            return
        self.at_step(t, step)
        url = e.get("url")
        deleted = bool(url and self.exists is not None and not self.exists(url))
        self.tl.checkpoints.append({"step": step, "time": t, "seconds": e.get("seconds", 0.0),
                                    "blocking_seconds": e.get("blocking_seconds", 0.0), "url": url,
                                    "deleted": deleted})  # fmt: skip
        self.last_ckpt = t

    def stop(self, t: float, e: StopEvent) -> None:
        self.stopped, step = t, e.get("step")
        if isinstance(step, int):
            self.at_step(t, step)
        self.last_stop = len(self.tl.marks)
        self.tl.marks.append({"kind": "stop", "time": t, "text": f"stopped at step {step} (checkpointed)"})

    def worker_exit(self, t: float, e: WorkerExitEvent) -> None:
        if None not in (e.get("pid"), self.pid) and e.get("pid") != self.pid:
            return  # the worker a warm one took over from: the current one lives on
        self.exited, self.stopped = (self.stopped if self.stopped is not None else t), None
        if self.started is not None and self.restored is None:
            self.trained(t)  # it never trained: its whole life was start-up
        code = e.get("returncode")
        if code is None or code in self.ok_codes:
            return
        began = self.last_ckpt if self.last_ckpt is not None else (self.current[0][0] if self.current else t)
        if began < t:
            self.tl.lost.append({"start": began, "end": t})
        text = (
            f"worker exited {code}: {t - began:.1f} s of work since the last checkpoint lost and recomputed"
        )
        self.tl.marks.append({"kind": "failure", "time": t, "text": text})

    def restart(self, t: float, e: RestartEvent) -> None:
        if e.get("reason") != "requested":
            return
        env = " ".join(f"{k}={v}" for k, v in e.get("env", {}).items())
        what, who = (
            ("warm hand-over", "the warm worker took over")
            if e.get("warm")
            else ("restarted in place", "the new worker started")
        )
        text = f"{what} {env} (down {e.get('downtime_seconds', 0.0):.2f} s until {who})"
        if self.last_stop is not None:  # the worker's stop was this migration's: one mark, when it left
            left = self.tl.marks[self.last_stop]
            self.tl.marks[self.last_stop] = {"kind": "migration", "time": left["time"],
                                             "text": f"{left['text']}, then {text}"}  # fmt: skip
            self.last_stop = None
        else:
            self.tl.marks.append({"kind": "migration", "time": t, "text": text})

    def finish(self, status: Status) -> None:
        """After the last event: the worker starting now, and the status's last step."""
        tl = self.tl
        if self.started is not None and self.restored is None and status.get("state") == "starting":
            tl.startups.append({"start": self.started, "end": status.get("updated", self.started)})
            self.started = None
        self.trained(self.restored)
        if "updated" in status and "step" in status:
            self.current.append((status["updated"], status["step"]))
            tl.last_status = self.current[-1]
        if self.current:
            tl.segments.append(self.current)


def build(
    job_id: str, events: list[Event], status: Status, exists: Callable[[str], bool] | None = None
) -> Timeline:
    """The timeline of a job; ``exists(url)`` tells whether a checkpoint is still on storage."""
    tl = Timeline(job_id)
    b = _Builder(tl, checkpoint_codes(events, status), exists)
    handlers: dict[str, Callable[[float, Event], None]] = {
        "run_start": b.run_start,
        "worker_start": b.worker_start,
        "warm_start": b.warm_start,
        "warm_discarded": b.warm_discarded,
        "training_start": b.training_start,
        "resume": b.resume,
        "checkpoint": b.checkpoint,
        "stop": b.stop,
        "worker_exit": b.worker_exit,
        "restart": b.restart,
    }
    for e in sorted(events, key=lambda e: e["time"]):
        handler = handlers.get(e["event"])
        if handler is not None:
            handler(e["time"], e)
    b.finish(status)
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
