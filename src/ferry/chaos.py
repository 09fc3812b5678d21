"""``ferry chaos``: a soak test of the whole product. A training command runs once plainly
(the reference), then under ``ferry run`` while seeded faults are injected at random
moments, until it finishes; then its outputs are compared with the reference's.

The contract with the command (docs/chaos.md): it writes its outputs to files under its
working directory. The reference and the chaos run get working directories of their own
under ``--work``; ``--compare FILE`` names a file that must be equal byte for byte (final
parameters), ``--steps FILE`` a per-step log whose lines start with the step number: the
last line written for each step must equal the reference's (a step recomputed after a
lost worker is written again, and the last write wins).

The seed fixes the order of the faults and the pauses between them; the step each fault
lands on depends on timing, so two runs with one seed differ in detail, never in result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import filecmp
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ferry.errors import ConfigError, FerryError, JobError
from ferry.runtime import control
from ferry.runtime.jobdir import JobDir
from ferry.runtime.procs import group_members

CHECKPOINT_CODE = 85

KINDS = (
    "checkpoint",  # a `checkpoint` control request: save and go on
    "stop",  # a `stop` control request: save, exit 85; the tool runs `ferry run` again
    "preempt",  # SIGTERM to the supervisor, as a scheduler does: checkpoint, exit 85
    "kill-worker",  # SIGKILL to one process of the worker's group; --max-failures restarts it
    "kill-supervisor",  # SIGKILL to `ferry run`; the tool kills the orphaned worker, reruns
    "migrate",  # a `restart` control request with another CUDA_VISIBLE_DEVICES
    "disk-full",  # the checkpoint filesystem (a tmpfs) is filled for one save (root only)
)
DEVICE_ASSIGNMENTS = ("0", "1", "0,1", "1,0")


class ChaosError(JobError):
    """The soak could not run to its end (not: the results differ, that is a verdict)."""


@dataclass(kw_only=True)
class ChaosOptions:
    """One soak."""

    work: str
    """Folder for the working copies (``ref/``, ``run-N/``), checkpoints and FERRY_HOME."""
    seed: int = 0
    """Seeds the order of the faults and the pauses between them."""
    events: int = 30
    """Faults to inject in all. When the job finishes first, it is run again from scratch
    (a new round, compared with the reference too) until this many were injected."""
    every_steps: int = 5
    """Periodic checkpoint every N steps (``ferry run --every-steps``)."""
    kinds: tuple[str, ...] = KINDS
    """Fault kinds to draw from; those that cannot run here are dropped with a note."""
    compare: tuple[str, ...] = ()
    """Files (relative to the working copy) that must be equal byte for byte."""
    steps: tuple[str, ...] = ()
    """Per-step logs (relative to the working copy): last line per leading step number."""
    pause: tuple[float, float] = (0.3, 1.5)
    """Seconds of the worker running between two faults: drawn uniformly in this range."""
    timeout: float = 1800.0
    """Give up (ChaosError) after this many seconds."""
    duration: float | None = None
    """Inject no more faults after this many seconds (the job then runs to its end and is
    compared): a soak bounded by time rather than by ``events``. None: no bound."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the command (both runs)."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.kinds) - set(KINDS))  # a kind named twice is drawn twice as often
        if unknown:
            raise ConfigError(f"unknown fault kind(s) {', '.join(unknown)}; use some of {', '.join(KINDS)}")
        if not self.compare and not self.steps:
            raise ConfigError("nothing to compare: name the outputs with --compare FILE and/or --steps FILE")
        if self.events < 0 or self.every_steps < 1:
            raise ConfigError("--events must be >= 0 and --every-steps >= 1")
        lo, hi = self.pause
        if not 0 < lo <= hi:
            raise ConfigError(f"--pause needs 0 < MIN <= MAX, got {lo} {hi}")


@dataclass
class Summary:
    seed: int
    rounds: int = 0
    injected: Counter[str] = field(default_factory=Counter)
    skipped_kinds: dict[str, str] = field(default_factory=dict)
    checkpoints: int = 0
    checkpoint_failures: int = 0
    supervisor_runs: int = 0
    failed_runs: int = 0
    worker_starts: int = 0
    steps: int = 0
    steps_recomputed: int = 0
    differences: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def equal(self) -> bool:
        return not self.differences

    def as_dict(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["injected"] = dict(sorted(self.injected.items()))
        doc["events"] = sum(self.injected.values())
        doc["equal"] = self.equal
        return doc

    def table(self) -> str:
        rows = [("seed", str(self.seed)), ("rounds (full runs under chaos)", str(self.rounds))]
        rows.append(("events injected", str(sum(self.injected.values()))))
        rows += [(f"  {k}", str(v)) for k, v in sorted(self.injected.items())]
        rows += [(f"  {k} (skipped)", why) for k, why in self.skipped_kinds.items()]
        rows += [
            ("checkpoints committed", str(self.checkpoints)),
            ("checkpoint saves failed", str(self.checkpoint_failures)),
            ("`ferry run` invocations", str(self.supervisor_runs)),
            ("  of which failed after a late fault", str(self.failed_runs)),
            ("worker starts", str(self.worker_starts)),
            ("steps per run", str(self.steps)),
            ("steps lost and recomputed", str(self.steps_recomputed)),
            ("seconds", f"{self.seconds:.1f}"),
            ("result", "EQUAL to the uninterrupted run" if self.equal else "DIFFERENT"),
        ]
        rows += [("  difference", d) for d in self.differences[:20]]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


# ------------------------------------------------------------------------------ outputs


def step_record(path: str) -> tuple[dict[int, str], int]:
    """The last line written for each step (lines that start with an integer), and how
    many step lines there were in all (more than steps: work was recomputed)."""
    last: dict[int, str] = {}
    total = 0
    with open(path, errors="replace") as f:
        for line in f:
            key = line.split(" ", 1)[0]
            if key.isdigit() and line.endswith("\n"):
                last[int(key)] = line
                total += 1
    return last, total


def compare_outputs(ref: str, run: str, options: ChaosOptions) -> tuple[list[str], int, int]:
    """Differences between two working copies; the steps per run and the recomputed ones
    (from the first --steps log)."""
    diffs: list[str] = []
    steps = recomputed = 0
    for name in options.compare:
        a, b = os.path.join(ref, name), os.path.join(run, name)
        if not os.path.isfile(b):
            diffs.append(f"{name}: missing in the chaos run")
        elif not filecmp.cmp(a, b, shallow=False):
            diffs.append(f"{name}: differs")
    for i, name in enumerate(options.steps):
        if not os.path.isfile(os.path.join(run, name)):
            diffs.append(f"{name}: missing in the chaos run")
            continue
        want, _ = step_record(os.path.join(ref, name))
        got, total = step_record(os.path.join(run, name))
        if i == 0:
            steps, recomputed = len(got), total - len(got)
        if set(want) != set(got):
            diffs.append(f"{name}: steps {len(got)} != reference {len(want)}")
        bad = [s for s in sorted(want) if s in got and got[s] != want[s]]
        if bad:
            diffs.append(f"{name}: {len(bad)} step(s) differ, first: step {bad[0]}")
    return diffs, steps, recomputed


def absolute_command(command: Sequence[str]) -> list[str]:
    """Arguments that name an existing file or folder here are made absolute, because the
    command runs in a working copy of its own (``train.py`` keeps working, ``--out out``
    stays relative to the working copy)."""
    return [os.path.abspath(a) if not a.startswith("-") and os.path.exists(a) else a for a in command]


# ------------------------------------------------------------------------------ processes


def _parents() -> dict[int, int]:
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != b"Z":
                parents[int(name)] = int(fields[1])
    return parents


def process_tree(root: int) -> list[int]:
    """``root`` and its live descendants. torchrun starts each rank in a session of its own,
    so the worker's process group alone does not hold them."""
    parents = _parents()
    tree, grew = {root} if root in parents else set(), True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree |= more
        grew = bool(more)
    return sorted(tree)


def kill_tree(root: int, timeout: float = 30.0) -> None:
    """SIGKILL the worker's process group and every descendant of the worker."""
    deadline = time.monotonic() + timeout
    pids = set(process_tree(root)) | set(group_members(root))
    while pids:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise ChaosError(f"processes {sorted(pids)} survive SIGKILL")
        time.sleep(0.05)
        parents = _parents()
        pids = {p for p in pids if p in parents}


class DiskFiller:
    """A small tmpfs of our own holding the checkpoints; ``fill()`` leaves no room on it."""

    def __init__(self, mountpoint: str, size_mb: int = 512) -> None:
        self.mountpoint = mountpoint
        self.ballast = os.path.join(mountpoint, ".chaos-ballast")
        os.makedirs(mountpoint, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", mountpoint],
            check=True,
            capture_output=True,
        )

    @staticmethod
    def available() -> str | None:
        """None when usable here, else why not."""
        if os.geteuid() != 0:
            return "needs root, to mount a small tmpfs for the checkpoints"
        if shutil.which("mount") is None:
            return "no mount command"
        return None

    def fill(self) -> None:
        st = os.statvfs(self.mountpoint)
        with open(self.ballast, "wb") as f, contextlib.suppress(OSError):
            chunk = b"\0" * (1 << 20)
            for _ in range(st.f_bavail * st.f_frsize // len(chunk) + 1):
                f.write(chunk)
            f.flush()

    def drain(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.ballast)

    def close(self) -> None:
        self.drain()
        subprocess.run(["umount", "-l", self.mountpoint], check=False, capture_output=True)


# ------------------------------------------------------------------------------ the soak


class Soak:
    """Runs the reference, then rounds under chaos until ``options.events`` were injected."""

    def __init__(
        self, command: Sequence[str], options: ChaosOptions, echo: Callable[[str], None] = print
    ) -> None:
        if not command:
            raise ConfigError(
                "no command: put it after --, e.g. `ferry chaos --compare out.txt -- python train.py`"
            )
        self.command = absolute_command(command)
        self.options = options
        self.echo = echo
        self.rng = random.Random(options.seed)
        self.work = os.path.abspath(options.work)
        self.summary = Summary(seed=options.seed)
        # Unique per soak: a job's in-place restart hands its state over in host memory under
        # /dev/shm/ferry-<uid>-<job id>, shared by every job of that id on this machine.
        self.job_id = f"chaos-{os.getpid()}"
        self.kinds = list(options.kinds)
        self.disk: DiskFiller | None = None
        self._sup: subprocess.Popen[bytes] | None = None
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
        self.env.update(options.env, FERRY_HOME=os.path.join(self.work, "home"), PYTHONUNBUFFERED="1")

    def run(self) -> Summary:
        started = self._started = time.monotonic()
        self._deadline = started + self.options.timeout
        os.makedirs(self.work, exist_ok=True)
        if "disk-full" in self.kinds and (why := DiskFiller.available()):
            self.kinds = [k for k in self.kinds if k != "disk-full"]
            self.summary.skipped_kinds["disk-full"] = why
        if not self.kinds and self.options.events:
            raise ChaosError("no fault kind can run here")
        try:
            ref = self._fresh("ref")
            self.echo(f"ferry chaos: reference run in {ref}")
            proc = subprocess.run(self.command, cwd=ref, env=self.env, timeout=self._left(), check=False)
            if proc.returncode != 0:
                raise ChaosError(f"the reference run exited with {proc.returncode}: fix the command first")
            while True:
                self.summary.rounds += 1
                run = self._fresh(f"run-{self.summary.rounds}")
                self._round(run)
                diffs, steps, recomputed = compare_outputs(ref, run, self.options)
                self.summary.differences += [f"round {self.summary.rounds}: {d}" for d in diffs]
                self.summary.steps = steps
                self.summary.steps_recomputed += recomputed
                if not self._injecting() or diffs:
                    break
        finally:
            self._cleanup()
            self.summary.seconds = time.monotonic() - started
        return self.summary

    def _cleanup(self) -> None:
        """Leave nothing behind, also when interrupted: the supervisor, its worker, the tmpfs."""
        sup = self._sup
        if sup is not None and sup.poll() is None:
            sup.kill()
            sup.wait()
            worker = JobDir(os.path.join(self.work, "home", "jobs", self.job_id)).status().get("worker_pid")
            if isinstance(worker, int):
                kill_tree(worker)
        if self.disk is not None:
            self.disk.close()
            self.disk = None

    # -------------------------------------------------------------- one round
    def _fresh(self, name: str) -> str:
        path = os.path.join(self.work, name)
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        return path

    def _left(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise ChaosError(f"the soak ran past its {self.options.timeout:g} s timeout")
        return left

    def _round(self, cwd: str) -> None:
        """One full run under chaos: `ferry run` again after every stop, until exit 0."""
        ckpt = os.path.join(self.work, "ckpt")
        if self.disk is not None:
            self.disk.close()
            self.disk = None
        shutil.rmtree(ckpt, ignore_errors=True)
        if "disk-full" in self.kinds:
            self.disk = DiskFiller(ckpt)
        shutil.rmtree(os.path.join(self.work, "home"), ignore_errors=True)
        job = JobDir.create(self.job_id, os.path.join(self.work, "home", "jobs", self.job_id))
        budget = self.options.events + 10
        cmd = [
            sys.executable, "-c", "import sys; from ferry.cli import main; sys.argv[0] = 'ferry'; main()",
            "run", "--dir", os.path.join(ckpt, "job"), "--job-id", self.job_id,
            "--every-steps", str(self.options.every_steps), "--max-failures", str(budget),
            "--restarts", str(budget), "--backoff", "0.1", "--", *self.command,
        ]  # fmt: skip
        first_events = len(job.events())
        while True:
            self.summary.supervisor_runs += 1
            sup = self._sup = subprocess.Popen(cmd, cwd=cwd, env=self.env)
            injected = sum(self.summary.injected.values())
            killed = self._inject_while(sup, job)
            code = sup.wait(self._left())
            if killed or code == CHECKPOINT_CODE:
                continue
            if code == 0:
                break
            if sum(self.summary.injected.values()) == injected:
                raise ChaosError(f"`ferry run` exited with {code} unprovoked; see {job.path}/events.jsonl")
            # A stop that came after the last safe point (the script was writing its results)
            # fails the run without a checkpoint; a scheduler requeues it, so do we.
            self.summary.failed_runs += 1
        events = job.events()[first_events:]
        counts = Counter(str(e.get("event")) for e in events)
        self.summary.checkpoints += counts["checkpoint"]
        self.summary.checkpoint_failures += counts["checkpoint_failed"]
        self.summary.worker_starts += counts["worker_start"]

    def _inject_while(self, sup: subprocess.Popen[bytes], job: JobDir) -> bool:
        """Inject faults while `ferry run` lives; True when it was SIGKILLed (then the orphaned
        worker group was killed too)."""
        up_since, seen = 0.0, None
        pause = self._pause()
        while sup.poll() is None:
            self._left()
            time.sleep(0.05)
            if not self._injecting():
                continue
            worker = self._running_worker(job, sup.pid)
            if worker is None:
                continue
            if worker != seen:  # a new worker: its pause starts once it trains
                up_since, seen = time.monotonic(), worker
            if time.monotonic() - up_since < pause:
                continue
            kind = self.rng.choice(self.kinds)
            self.summary.injected[kind] += 1
            n = sum(self.summary.injected.values())
            self.echo(
                f"ferry chaos: event {n}/{self.options.events}: {kind} (step {job.status().get('step')})"
            )
            if self._inject(kind, sup, job, worker):
                return True
            up_since, pause = time.monotonic(), self._pause()
        return False

    def _injecting(self) -> bool:
        if self.options.duration is not None and time.monotonic() - self._started > self.options.duration:
            return False
        return sum(self.summary.injected.values()) < self.options.events

    def _pause(self) -> float:
        return self.rng.uniform(*self.options.pause)

    def _running_worker(self, job: JobDir, supervisor: int) -> int | None:
        """The worker's pid once it trains (its session reported in, after this start)."""
        status = job.status()
        pid = status.get("worker_pid")
        if status.get("supervisor_pid") != supervisor or not isinstance(pid, int):
            return None
        if status.get("state") not in ("running", "resumed", "checkpointing", "checkpointed"):
            return None
        if float(status.get("updated", 0)) < float(status.get("worker_started", 0) or 0):
            return None
        return pid if group_members(pid) else None

    def _inject(self, kind: str, sup: subprocess.Popen[bytes], job: JobDir, worker: int) -> bool:
        if kind == "checkpoint":
            control.submit(job, "checkpoint")
        elif kind == "stop":
            control.submit(job, "stop")
        elif kind == "preempt":
            sup.send_signal(signal.SIGTERM)
        elif kind == "migrate":
            devices = self.rng.choice(DEVICE_ASSIGNMENTS)
            control.submit(job, "restart", env={"CUDA_VISIBLE_DEVICES": devices})
        elif kind == "kill-worker":
            # A training process: the worker, or one rank under a launcher (torchrun). The
            # launcher itself is spared: SIGKILLed, it leaves its ranks running (docs/chaos.md).
            tree = process_tree(worker)
            parents = _parents()
            ranks = [p for p in tree if not any(parents.get(c) == p for c in tree)] or [worker]
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.rng.choice(ranks), signal.SIGKILL)
        elif kind == "kill-supervisor":
            tree = process_tree(worker)  # before the supervisor dies and its worker is orphaned
            sup.kill()
            sup.wait()
            for pid in tree:
                kill_tree(pid)
            return True
        elif kind == "disk-full":
            self._disk_full(job, sup)
        return False

    def _disk_full(self, job: JobDir, sup: subprocess.Popen[bytes]) -> None:
        """Fill the checkpoint filesystem, ask for a checkpoint, free it once the save was
        answered (or the worker went away)."""
        assert self.disk is not None
        self.disk.fill()
        try:
            rid = control.submit(job, "checkpoint")
            with contextlib.suppress(FerryError):
                control.wait_response(job, rid, timeout=30, alive=lambda: sup.poll() is None)
        finally:
            self.disk.drain()


def summary_json(summary: Summary) -> str:
    return json.dumps(summary.as_dict(), indent=1, sort_keys=True)
