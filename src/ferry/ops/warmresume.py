"""``ferry resume --warm``: start a job's worker on this node before the node it runs on
stops it, and let it take over from the bundle that ``ferry export`` writes there.

The gate (``supervisor.warm.WarmGate``) waits for ``bundle.json`` at the bundle's URL, checks
that the bundle's command is the one this worker runs, copies its checkpoint into the new
job's checkpoint root, and releases the worker, which restores it. Once the worker trained
its first two steps, it reports the move's downtime from the times the bundle records
(the export's stop request, the commit) and the new job's events: both nodes' clocks are
used, so they must agree (NTP) for the figures to hold across nodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ferry.errors import FerryError
from ferry.ops.bundle import Bundle, load_bundle, prepare_resume
from ferry.ops.warmmove import first_step
from ferry.progress import Progress
from ferry.runtime.jobdir import JobDir


@dataclass
class NodeMove:
    """A job's move between nodes through a bundle, as the resuming node saw it (seconds)."""

    step: int
    drain: float | None
    """From the export's stop request to the start of the save (None: the job was not
    running when it was exported)."""
    save: float | None
    export: float | None
    """From the commit to the bundle's ``bundle.json``: the checkpoint copied into the bundle."""
    fetch: float
    """From the bundle's ``bundle.json`` (or, for a job that was not running, this node
    noticing it) to the worker's release: the checkpoint copied into the new job's root."""
    restore: float
    first_step: float | None
    """The first step's warm-up, beyond the second step's length."""

    @property
    def downtime(self) -> float:
        parts = (self.drain, self.save, self.export, self.fetch, self.restore, self.first_step)
        return sum(p or 0.0 for p in parts)


class BundleGate:
    """Waits for the bundle at ``source`` and puts its checkpoint into ``dest_dir``."""

    def __init__(self, source: str, dest_dir: str, command: list[str], progress: Progress) -> None:
        self.source, self.dest_dir, self.command, self.progress = source, dest_dir, command, progress
        self.bundle: Bundle | None = None
        self.noticed = 0.0
        self.fetched = 0.0
        self.move: NodeMove | None = None

    def ready(self, pid: int, seconds: float) -> None:
        self.progress(
            f"worker pid {pid} waits at its restore point (start-up {seconds:.1f} s); waiting for the "
            f"bundle at {self.source}: `ferry export JOB {self.source}` on the job's node moves it here"
        )

    def poll(self) -> str | None:
        try:
            bundle = load_bundle(self.source)
        except FerryError as exc:
            return f"the bundle at {self.source} is unusable: {exc}"
        if bundle is None:
            return None
        self.noticed = time.time()
        if bundle.get("command") != self.command:
            return (
                f"the bundle at {self.source} holds job {bundle.get('job')}, started with another command "
                f"({bundle.get('command')}) than this worker's: start it with `ferry resume {self.source}`"
            )
        try:
            prepare_resume(self.source, self.dest_dir, self.command, None, self.progress)
        except FerryError as exc:
            return f"cannot take the checkpoint of the bundle at {self.source}: {exc}"
        self.bundle, self.fetched = bundle, time.time()
        self.progress(f"bundle of job {bundle.get('job')} at step {bundle.get('step')} copied; taking over")
        return ""

    def settled(self, job: JobDir) -> bool:
        """Once the worker trained two steps: say how long the move kept the job down."""
        events = job.events()
        resumed = [e for e in events if e["event"] == "resume"]
        first = [e for e in events if e["event"] == "first_step"]
        if not resumed or not first or self.bundle is None:
            return job.status().get("state") not in ("starting", "running", "resumed", "checkpointing")
        b, resume = self.bundle, resumed[-1]
        restore = float(resume.get("seconds", 0.0))
        stopped = "stop_requested" in b and "committed" in b
        save = b.get("save_seconds", 0.0) if stopped else None
        start = b["created"] if stopped else self.noticed
        self.move = NodeMove(
            step=int(resume.get("step") or 0),
            drain=max(0.0, b["committed"] - b.get("save_seconds", 0.0) - b["stop_requested"])
            if stopped
            else None,
            save=save,
            export=max(0.0, b["created"] - b["committed"]) if stopped else None,
            fetch=max(0.0, resume["time"] - restore - start),
            restore=restore,
            first_step=first_step(first[-1]),
        )
        m = self.move
        parts = (
            [f"drain {m.drain:.2f} s", f"save {m.save:.2f} s", f"export {m.export:.2f} s"] if stopped else []
        )
        parts += [
            f"fetch {m.fetch:.2f} s",
            f"restore {m.restore:.2f} s",
            f"first step {m.first_step or 0.0:.2f} s",
        ]
        since = (
            "" if stopped else " (the job was not running when it was exported: from the bundle's arrival)"
        )
        self.progress(f"took over at step {m.step}: downtime {m.downtime:.2f} s{since} ({', '.join(parts)})")
        return True
