"""Helper of test_crash_consistency.py: a fork server whose children save checkpoints in a
loop until they are SIGKILLed.

Starting Python with torch takes a second or more; the crash test needs dozens of fresh
processes, so this server imports everything once and forks a child per trial (it starts
no thread before forking, so the children are clean). Every child is a real process that
the test kills with a real SIGKILL.

The saved state is a pure function of the step (``make_state``), so the test can check
what any checkpoint holds. Protocol, one line per message:

    test   -> server  "fork<TAB>ROOT<TAB>FIRST_STEP<TAB>sync|async" (tabs: ROOT may hold spaces)
    server -> test    "forked PID"
    child  -> test    "save PID STEP" just before a save starts,
                      "done PID STEP SECONDS" once it is committed
    test   -> server  "reap<TAB>PID"
    server -> test    "reaped PID SIGNAL" (SIGNAL is 0 when the child exited by itself)
    test   -> server  "quit"
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any

import numpy as np
import torch

from ferry.engine import AsyncSaver, save

BIG = [(256, 1024)] * 6  # six float32 tensors of 1 MiB: six separate writes per save
SMALL = [(7,), (3, 5), (130,)]  # gathered into one write
KEEP_LAST = 3

_bases: list[torch.Tensor] = []


def _base() -> list[torch.Tensor]:
    if not _bases:
        gen = torch.Generator().manual_seed(1234)
        _bases.extend(torch.randn(s, generator=gen) for s in [*BIG, *SMALL])
    return _bases


def make_state(step: int) -> dict[str, Any]:
    """The training state of step ``step``: about 6 MiB, every value depends on the step."""
    tensors = [b + step for b in _base()]
    return {
        "model": {f"w{i}": t for i, t in enumerate(tensors[: len(BIG)])},
        "small": tensors[len(BIG) :],
        "counts": np.arange(1000, dtype=np.int64) * step,
        "step": step,
        "tag": f"step {step}",
    }


def advance(state: dict[str, Any], step: int) -> None:
    """Turn ``state`` into ``make_state(step)`` in place, as a training step would."""
    fresh = make_state(step)
    for name, t in state["model"].items():
        t.copy_(fresh["model"][name])
    for t, f in zip(state["small"], fresh["small"], strict=True):
        t.copy_(f)
    state["counts"][:] = fresh["counts"]
    state["step"], state["tag"] = fresh["step"], fresh["tag"]


def data_size() -> int:
    """Bytes of the data file of one checkpoint (the same for every step)."""
    from ferry.engine.codec import flatten, layout

    return layout(flatten(make_state(0)).entries)


def _emit(line: str) -> None:
    os.write(1, (line + "\n").encode())  # one write, under PIPE_BUF: lines never interleave


def _child(root: str, step: int, mode: str) -> None:
    pid = os.getpid()
    state = make_state(step)
    saver = AsyncSaver(root, keep_last=KEEP_LAST) if mode == "async" else None
    while True:
        _emit(f"save {pid} {step}")
        t0 = time.perf_counter()
        if saver is not None:
            handle = saver.save(state, step=step)
            advance(state, step + 1)  # training goes on while the checkpoint is persisted
            handle.wait()
        else:
            save(state, root, step=step, keep_last=KEEP_LAST)
            advance(state, step + 1)
        _emit(f"done {pid} {step} {time.perf_counter() - t0:.6f}")
        step += 1


def main() -> None:
    children: set[int] = set()
    for line in sys.stdin:
        cmd = line.rstrip("\n").split("\t")
        if not cmd[0]:
            continue
        if cmd[0] == "fork":
            pid = os.fork()
            if pid == 0:
                try:
                    _child(cmd[1], int(cmd[2]), cmd[3])
                except BaseException:
                    _emit("error " + traceback.format_exc().replace("\n", " | "))
                finally:
                    os._exit(3)
            children.add(pid)
            _emit(f"forked {pid}")
        elif cmd[0] == "reap":
            pid = int(cmd[1])
            _, status = os.waitpid(pid, 0)
            children.discard(pid)
            _emit(f"reaped {pid} {os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0}")
        elif cmd[0] == "quit":
            break
    for pid in children:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
