"""Asynchronous multi-rank saves under real torchrun (gloo, CPU), one lineage of runs:

1. rank 1 is SIGKILLed in the middle of writing its part of a background save: the
   checkpoint before it stays the newest listed, and no part of the killed one is;
2. the resumed run gets a stop signal on rank 1 alone while rank 0's background save
   stalls: every rank stops at the same step, after the stalled save committed;
3. every step of both runs (the killed one included) logs what an uninterrupted run logs,
   and the stop's checkpoint holds every rank's state of the step they stopped at.

The checkpoint root stalls on purpose (scripts/ranks_async.py, ``--hold``), so that each
kill and signal lands while a save is in flight whatever the machine's load.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from ferry.engine import list_checkpoints, load
from ferry.engine.ranks import rank_part
from ferry.storage import open_storage

from trainrun import SCRIPTS, env_for, pid_of_rank, wait_for

pytestmark = pytest.mark.integration

TORCHRUN = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2"]
SCRIPT = str(SCRIPTS / "ranks_async.py")
STEPS, SIZE = 30, 4096


def expected(rank: int) -> dict[int, str]:
    """What an uninterrupted run of rank ``rank`` logs at each step."""
    gen = torch.Generator().manual_seed(100 + rank)
    w = torch.zeros(SIZE)
    out = {}
    for step in range(1, STEPS + 1):
        w.add_(torch.randn(SIZE, generator=gen))
        out[step] = hashlib.sha1(w.numpy().tobytes()).hexdigest()[:16]
    return out


class Job:
    """torchrun running the script, its stderr collected line by line."""

    def __init__(self, env: dict[str, str], out: Path, *args: str) -> None:
        self.out = out
        cmd = [*TORCHRUN, SCRIPT, "--out", str(out), "--steps", str(STEPS), "--sleep", "0.02", *args]
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def said(self, words: str) -> bool:
        return any(words in line for line in self.lines)

    def logged(self, rank: int, step: int) -> bool:
        log = self.out / f"rank{rank}.log"
        return log.exists() and any(line.startswith(f"{step} ") for line in log.read_text().splitlines())

    def end(self) -> int:
        code = self.proc.wait(timeout=120)
        self._reader.join(10)
        return code

    def stderr(self) -> str:
        return "".join(self.lines)[-4000:]


def steps_listed(root: Path) -> list[int]:
    return [ref.step for ref in list_checkpoints(open_storage(str(root)))]


def test_torchrun_async_saves_survive_a_killed_rank_and_stop_together(tmp_path: Path) -> None:
    env = env_for(
        tmp_path / "home", OMP_NUM_THREADS="1", FERRY_EVERY_STEPS="4", FERRY_DIR=str(tmp_path / "ck")
    )
    hold, release = tmp_path / "hold", tmp_path / "release"

    # 1. rank 1 stalls mid-write in its second save (step 8) and is SIGKILLed there
    hold.touch()
    killed = Job(env, tmp_path / "a", "--hold", str(hold), "--hold-name", "rank-1.bin", "--hold-nth", "2",
                 "--pause-at", "9", "--release", str(release))  # fmt: skip
    wait_for("rank 1 to stall in its part of step 8", lambda: Path(f"{hold}.held").exists(), killed.proc)
    wait_for("both ranks at step 9", lambda: killed.logged(0, 9) and killed.logged(1, 9), killed.proc)
    assert steps_listed(tmp_path / "ck") == [4]  # step 8 waits for rank 1's part
    os.kill(int(Path(f"{hold}.held").read_text()), signal.SIGKILL)
    release.touch()
    assert killed.end() != 0
    assert steps_listed(tmp_path / "ck") == [4], killed.stderr()
    assert not [p for p in (tmp_path / "ck").glob("step-*8*")]

    # 2. resumed from step 4; rank 0's second save (step 12) stalls; rank 1 alone gets SIGUSR1
    hold.touch()
    release.unlink()
    Path(f"{hold}.held").unlink()
    stopped = Job(env, tmp_path / "b", "--hold", str(hold), "--hold-name", "data-0.bin", "--hold-nth", "2",
                  "--pause-at", "14", "--release", str(release))  # fmt: skip
    wait_for("rank 0 to stall in its part of step 12", lambda: Path(f"{hold}.held").exists(), stopped.proc)
    wait_for("both ranks at step 14", lambda: stopped.logged(0, 14) and stopped.logged(1, 14), stopped.proc)
    rank1 = pid_of_rank(SCRIPT, 1, stopped.out)
    assert rank1 is not None, "no process of rank 1"
    os.kill(rank1, signal.SIGUSR1)
    release.touch()
    wait_for("the ranks to agree on the stop", lambda: stopped.said("ferry: stopping at step"), stopped.proc)
    assert steps_listed(tmp_path / "ck") == [4, 8]  # step 12 is still being written
    hold.unlink()
    stopped.end()
    exits = {(tmp_path / "b" / f"exit{r}.txt").read_text().split()[0] for r in (0, 1)}
    at = {(tmp_path / "b" / f"exit{r}.txt").read_text().split()[1] for r in (0, 1)}
    assert exits == {"85"} and len(at) == 1, stopped.stderr()
    (stop_step,) = (int(s) for s in at)
    assert 14 <= stop_step <= 16
    assert steps_listed(tmp_path / "ck")[-2:] == [12, stop_step]

    # every step every run logged is what an uninterrupted run logs (the resume from step 4
    # too), and the stop's checkpoint holds each rank's state of the step they stopped at
    loaded = load(str(tmp_path / "ck"))
    assert loaded.step == stop_step
    for rank, part in ((0, loaded.state), (1, rank_part(loaded, 1))):
        want = expected(rank)
        assert part["ferry"]["global_step"] == stop_step
        assert (
            hashlib.sha1(part["objects"]["state"]["w"].numpy().tobytes()).hexdigest()[:16] == want[stop_step]
        )
        for run in ("a", "b"):
            for line in (tmp_path / run / f"rank{rank}.log").read_text().splitlines():
                step, got = line.split()
                assert want[int(step)] == got, (run, rank, line)
        resumed = (tmp_path / "b" / f"rank{rank}.log").read_text().splitlines()
        assert resumed[0].startswith("5 ") and resumed[-1].startswith(f"{stop_step} ")
