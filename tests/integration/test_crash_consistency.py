"""SIGKILL a process that saves checkpoints, at random moments of its saves, many times.

Each trial forks a fresh child (crash_child.py) that saves a ~6 MiB state in a loop, sync
or async. The test waits for the child to announce a save, sleeps a seeded random time
drawn uniformly over the measured duration of one save (so the kills fall in every write
phase in proportion to its length), and SIGKILLs it. The folder then shows which phase the
save was in, and this is recorded to prove the spread:

    no staging        the save had not created its staging folder yet (or was finished
                      and the next one had not started)
    data partial      the data file is shorter than it will be
    data complete     the data file is whole, no manifest yet
    manifest          the manifest is written, the folder not yet renamed
    committed         the checkpoint of the announced step is visible

After every kill: ``list_checkpoints`` lists only checkpoints that verify; the newest one
loads, with no fallback, and holds exactly the state of its step; the last checkpoint the
child reported as done is still there; the step being saved is listed exactly when its
folder was committed. Phases that the random kills happen to miss get a few targeted
trials (watch the folder, kill when the phase shows) so that every phase is proven.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

import crash_child
import numpy as np
import pytest
import torch

from ferry.engine import list_checkpoints, load, save, verify
from ferry.storage import open_storage
from ferry.storage.atomic import MANIFEST, STAGING_PREFIX
from ferry.storage.sweep import swept

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

RANDOM_TRIALS = 56
PHASES = ("no staging", "data partial", "data complete", "manifest", "committed")
SEED = 20240611


class ForkServer:
    """crash_child.py running as a fork server; lines from it and its children are queued."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(crash_child.__file__))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[list[str]] = []
        """Lines read while waiting for another kind: the children's progress reports."""
        assert self.proc.stdout is not None
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()

    def _pump(self, out: IO[bytes]) -> None:
        for raw in out:
            self.lines.put(raw.decode().rstrip("\n"))
        self.lines.put("eof")

    def send(self, *words: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(("\t".join(map(str, words)) + "\n").encode())
        self.proc.stdin.flush()

    def expect(self, kind: str, pid: int | None = None, timeout: float = 60) -> list[str]:
        """The next line of ``kind`` (from ``pid``); fails on a child's error report."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no {kind!r} line within {timeout} s") from None
            words = line.split(" ")
            if words[0] in ("error", "eof"):
                raise AssertionError(f"crash child failed: {line}")
            if words[0] == kind and (pid is None or int(words[1]) == pid):
                return words
            self.seen.append(words)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.send("quit")
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def phase_of(root: Path, step: int, data_size: int) -> str:
    """Which phase the save of ``step`` was in, read from the folder after the kill."""
    if any(r.step == step for r in list_checkpoints(open_storage(str(root)))):
        return "committed"
    staging = [n for n in os.listdir(root) if n.startswith(f"{STAGING_PREFIX}step-{step:012d}-")]
    if not staging:
        return "no staging"
    assert len(staging) == 1, staging
    folder = root / staging[0]
    try:  # while a targeted trial watches, the child may rename the folder under us
        files = os.listdir(folder)
        if MANIFEST in files:
            return "manifest"
        if "data-0.bin" not in files:
            return "staging empty"
        size = os.path.getsize(folder / "data-0.bin")
    except FileNotFoundError:
        return "renamed"
    return "data complete" if size == data_size else "data partial"


def assert_state(got: Any, want: Any, where: str) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.shape == want.shape, where
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), f"{where}: bytes differ"
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.tobytes() == want.tobytes(), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for k in want:
            assert_state(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_state(g, w, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


class Trials:
    def __init__(self, root: Path, server: ForkServer, caplog: pytest.LogCaptureFixture) -> None:
        self.root, self.server, self.caplog = root, server, caplog
        self.next_step = 1
        self.newest: int | None = None
        """The newest checkpoint listed after the previous kill."""
        self.phases: Counter[str] = Counter()
        self.durations: list[float] = []
        self.data_size = crash_child.data_size()
        self.log: list[str] = []

    def start(self, mode: str) -> tuple[int, int]:
        """Fork a child and wait for it to announce its first save: (pid, step)."""
        self.server.send("fork", self.root, self.next_step, mode)
        pid = int(self.server.expect("forked")[1])
        step = int(self.server.expect("save", pid)[2])
        return pid, step

    def kill(self, pid: int, step: int, mode: str, how: str) -> str:
        os.kill(pid, signal.SIGKILL)
        self.server.send("reap", pid)
        sig = int(self.server.expect("reaped", pid)[2])
        assert sig == signal.SIGKILL, f"child {pid} ended by itself (signal {sig}), not by the kill"
        done = [int(w[2]) for w in self.server.seen if w[0] == "done" and int(w[1]) == pid]
        saving = max([step] + [int(w[2]) for w in self.server.seen if w[0] == "save" and int(w[1]) == pid])
        self.durations += [float(w[3]) for w in self.server.seen if w[0] == "done" and int(w[1]) == pid]
        self.server.seen.clear()
        phase = phase_of(self.root, saving, self.data_size)
        self.phases[phase] += 1
        self.log.append(f"{mode:5} {how:9} step {saving}: {phase}")
        self.check(saving, phase, max(done, default=None))
        self.next_step = saving + 1
        return phase

    def check(self, saving: int, phase: str, last_done: int | None) -> None:
        storage = open_storage(str(self.root))
        refs = list_checkpoints(storage)
        for ref in refs:  # nothing partial is ever listed
            verify(storage, ref.name)
            assert ref.step <= saving, f"{ref.name} is newer than any save started"
        listed = [r.step for r in refs]
        # an interrupted save leaves the previous checkpoint the newest: nothing is lost
        before = max((s for s in (last_done, self.newest) if s is not None), default=None)
        want = saving if phase == "committed" else before
        assert (listed[-1] if listed else None) == want, f"step {saving} killed in {phase}: listed {listed}"
        self.newest = want
        if not refs:
            return
        self.caplog.clear()
        loaded = load(str(self.root))
        assert not [r for r in self.caplog.records if r.levelno >= logging.WARNING], "load fell back"
        assert loaded.url == refs[-1].url and loaded.step == refs[-1].step
        assert_state(loaded.state, crash_child.make_state(loaded.step), f"step {loaded.step}")

    def random_trial(self, rng: random.Random, mode: str) -> None:
        pid, step = self.start(mode)
        window = 1.2 * statistics.median(self.durations)
        time.sleep(rng.uniform(0, window))
        self.kill(pid, step, mode, "random")

    def targeted_trial(self, want: str, mode: str, rng: random.Random) -> str:
        """Watch the folder during a save and kill as soon as ``want`` shows."""
        pid, step = self.start(mode)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and phase_of(self.root, step, self.data_size) != want:
            pass
        time.sleep(rng.uniform(0, 0.0005))
        return self.kill(pid, step, mode, "targeted")


def test_sigkill_at_random_moments_never_exposes_a_partial_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ferry")
    root = tmp_path / "ckpt root with spaces"
    server = ForkServer()
    trials = Trials(root, server, caplog)
    rng = random.Random(SEED)
    t0 = time.monotonic()
    try:
        # calibration: let a child commit a few saves to measure how long one takes
        pid, step = trials.start("sync")
        for _ in range(5):
            server.seen.append(server.expect("done", pid))
        trials.kill(pid, step, "sync", "calibrate")
        for i in range(RANDOM_TRIALS):
            trials.random_trial(rng, "async" if i % 2 else "sync")
        for want in PHASES:
            for attempt in range(12):
                if trials.phases[want]:
                    break
                trials.targeted_trial(want, "async" if attempt % 2 else "sync", rng)
    finally:
        server.close()
    elapsed = time.monotonic() - t0
    summary = (
        f"{sum(trials.phases.values())} kills in {elapsed:.1f} s, save takes "
        f"{statistics.median(trials.durations) * 1e3:.1f} ms (median); phases: {dict(trials.phases)}"
    )
    print(summary)
    print("\n".join(trials.log))
    missing = [p for p in PHASES if not trials.phases[p]]
    assert not missing, f"no kill landed in {missing}: {summary}"
    assert sum(trials.phases.values()) >= 50

    # the leftovers of killed saves go away with the next save's retention
    save(crash_child.make_state(trials.next_step), str(root), step=trials.next_step, keep_last=3)
    swept()  # the checkpoints it retired are deleted in the background
    assert not [n for n in os.listdir(root) if n.startswith(STAGING_PREFIX)]
    assert [r.step for r in list_checkpoints(open_storage(str(root)))][-1] == trials.next_step
