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

from ferry.chaos.faults import DiskFiller, kill_tree, leaves
from ferry.chaos.outputs import absolute_command, compare_outputs
from ferry.chaos.remote import S3Remote
from ferry.chaos.summary import Summary
from ferry.errors import ConfigError, CorruptCheckpointError, FerryError, JobError, bug
from ferry.knobs import (
    CHAOS_BACKOFF_SECONDS,
    CHAOS_OUTAGE_SECONDS,
    CHAOS_PAUSE_SECONDS,
    CHAOS_REQUEST_SECONDS,
    CHAOS_SPARE_RESTARTS,
    CHAOS_TIMEOUT_SECONDS,
    CHECKPOINT_EXIT_CODE,
    PROCESS_POLL_SECONDS,
)
from ferry.runtime import control
from ferry.runtime.jobdir import JobDir
from ferry.runtime.procs import descendants, group_members

KINDS = (
    "checkpoint",  # a `checkpoint` control request: save and go on
    "stop",  # a `stop` control request: save, exit 85; the tool runs `ferry run` again
    "preempt",  # SIGTERM to the supervisor, as a scheduler does: checkpoint, exit 85
    "kill-worker",  # SIGKILL to one process of the worker's group; --max-failures restarts it
    "kill-supervisor",  # SIGKILL to `ferry run`; the tool kills the orphaned worker, reruns
    "migrate",  # a `restart` control request with another CUDA_VISIBLE_DEVICES
    "disk-full",  # the checkpoint filesystem (a tmpfs) is filled for one save (root only)
    "remote-down",  # the S3 server the checkpoints are copied to is unreachable for a while
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
    pause: tuple[float, float] = CHAOS_PAUSE_SECONDS
    """Seconds of the worker running between two faults: drawn uniformly in this range."""
    outage: tuple[float, float] = CHAOS_OUTAGE_SECONDS
    """Seconds a ``remote-down`` fault keeps the remote unreachable: drawn uniformly."""
    timeout: float = CHAOS_TIMEOUT_SECONDS
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
        for name, (lo, hi) in (("--pause", self.pause), ("--outage", self.outage)):
            if not 0 < lo <= hi:
                raise ConfigError(f"{name} needs 0 < MIN <= MAX, got {lo:g} {hi:g}")


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
        self.remote: S3Remote | None = None
        self._sup: subprocess.Popen[bytes] | None = None
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
        self.env.update(options.env, FERRY_HOME=os.path.join(self.work, "home"), PYTHONUNBUFFERED="1")

    def run(self) -> Summary:
        started = self._started = time.monotonic()
        self._deadline = started + self.options.timeout
        os.makedirs(self.work, exist_ok=True)
        for kind, why in (("disk-full", DiskFiller.available()), ("remote-down", S3Remote.available())):
            if kind in self.kinds and why:
                self.kinds = [k for k in self.kinds if k != kind]
                self.summary.skipped_kinds[kind] = why
        if not self.kinds and self.options.events:
            raise ChaosError("no fault kind can run here")
        try:
            if "remote-down" in self.kinds:
                self.remote = S3Remote(os.path.join(self.work, "s3"))
                self.summary.remote = True
            ref = self._fresh("ref")
            self.echo(f"ferry chaos: reference run in {ref}")
            proc = subprocess.run(self.command, cwd=ref, env=self.env, timeout=self._left(), check=False)
            if proc.returncode != 0:
                raise ChaosError(f"the reference run exited with {proc.returncode}: fix the command first")
            while True:
                self.summary.rounds += 1
                run = self._fresh(f"run-{self.summary.rounds}")
                self._round(run)
                diffs, steps, recomputed = compare_outputs(ref, run, self.options.compare, self.options.steps)
                diffs += self._check_remote()
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
        if self.remote is not None:
            self.summary.remote_outage_seconds = self.remote.down_seconds
            self.remote.close()
            self.remote = None

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
        budget = self.options.events + CHAOS_SPARE_RESTARTS
        cmd = [
            sys.executable, "-c", "import sys; from ferry.cli import main; sys.argv[0] = 'ferry'; main()",
            "run", "--dir", os.path.join(ckpt, "job"), "--job-id", self.job_id,
            "--every-steps", str(self.options.every_steps), "--max-failures", str(budget),
            "--max-restarts", str(budget), "--backoff", str(CHAOS_BACKOFF_SECONDS), "--", *self.command,
        ]  # fmt: skip
        env = dict(self.env)
        if self.remote is not None:  # each round copies to a prefix of its own
            env.update(self.remote.env(self._remote_prefix()))
        first_events = len(job.events())
        while True:
            self.summary.supervisor_runs += 1
            sup = self._sup = subprocess.Popen(cmd, cwd=cwd, env=env)
            injected = sum(self.summary.injected.values())
            killed = self._inject_while(sup, job)
            code = sup.wait(self._left())
            if killed or code == CHECKPOINT_EXIT_CODE:
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
        self.summary.remote_copies += counts["remote_copy"]
        self.summary.remote_copy_failures += counts["remote_copy_failed"]
        self.summary.remote_copies_skipped += counts["remote_copy_skipped"]
        self.summary.remote_retries += counts["remote_retry"]

    def _remote_prefix(self) -> str:
        return f"{self.job_id}/round-{self.summary.rounds}"

    def _check_remote(self) -> list[str]:
        """The remote is back up: every checkpoint it lists as committed must read back whole."""
        if self.remote is None:
            return []
        from ferry.engine.catalog import list_checkpoints
        from ferry.engine.reader import verify

        self.remote.restore()
        storage = self.remote.storage(self._remote_prefix())
        diffs = []
        for ref in list_checkpoints(storage):
            try:
                verify(storage, ref.name)
                self.summary.remote_verified += 1
            except CorruptCheckpointError as exc:
                diffs.append(f"the remote lists {ref.name} as committed, but it does not verify: {exc}")
        return diffs

    def _inject_while(self, sup: subprocess.Popen[bytes], job: JobDir) -> bool:
        """Inject faults while `ferry run` lives; True when it was SIGKILLed (then the orphaned
        worker group was killed too)."""
        up_since, seen = 0.0, None
        pause = self._pause()
        while sup.poll() is None:
            self._left()
            time.sleep(PROCESS_POLL_SECONDS)
            if self.remote is not None:
                self.remote.tick()
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
        # Not "checkpointed": that worker committed its stop and is on its way out (it may wait
        # for copies to the remote); a fault meant for a training worker would miss.
        if status.get("state") not in ("running", "resumed", "checkpointing"):
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
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.rng.choice(leaves(worker)), signal.SIGKILL)
        elif kind == "kill-supervisor":
            tree = descendants(worker)  # before the supervisor dies and its worker is orphaned
            sup.kill()
            sup.wait()
            for pid in tree:
                kill_tree(pid)
            return True
        elif kind == "disk-full":
            self._disk_full(job, sup)
        elif kind == "remote-down":
            self._remote_down(job, sup)
        return False

    def _remote_down(self, job: JobDir, sup: subprocess.Popen[bytes]) -> None:
        """Cut the remote, ask for a checkpoint whose copy meets the outage (not only a
        periodic one's, if one happens to fall into it), and wait until a copy's try failed
        (its ``remote_retry`` is in the events), the outage ended or the job went away.
        The rest of the outage runs on while other faults land (``_inject_while``)."""
        if self.remote is None:
            raise bug("a remote-down fault without a remote")
        self.remote.outage(self.rng.uniform(*self.options.outage))
        seen = len(job.events())
        control.submit(job, "checkpoint")
        while self.remote.is_down and sup.poll() is None:
            if any(e.get("event") == "remote_retry" for e in job.events()[seen:]):
                return
            time.sleep(PROCESS_POLL_SECONDS)
            self.remote.tick()

    def _disk_full(self, job: JobDir, sup: subprocess.Popen[bytes]) -> None:
        """Fill the checkpoint filesystem, ask for a checkpoint, free it once the save was
        answered (or the worker went away)."""
        if self.disk is None:
            raise bug("a disk-full fault without a disk to fill")
        self.disk.fill()
        try:
            rid = control.submit(job, "checkpoint")
            with contextlib.suppress(FerryError):
                control.wait_response(
                    job, rid, timeout=CHAOS_REQUEST_SECONDS, alive=lambda: sup.poll() is None
                )
        finally:
            self.disk.drain()
