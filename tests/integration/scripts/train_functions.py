"""A job whose state is not PyTorch at all, checkpointed with ``ferry.FunctionCheckpoint``.

The "training" is a pure-Python simulation: noisy gradient descent on a quadratic, with
momentum, driven by its own ``random.Random`` and by the global ``random`` module. Its
state is a dict of floats, a list of velocities, the private generator and a per-step
record. ``save_fn`` writes it as JSON files (one in a subfolder) into the folder ferry
gives it; ``restore_fn`` reads them back. ferry itself restores the global ``random``.

Writes VALUE (the final state, floats as exact hex) and STEPS (one line per step) under
``--out``, so runs can be compared byte for byte.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import time
from typing import Any

import ferry

VALUE, STEPS = "value.txt", "steps.txt"
TARGET = {"a": 1.5, "b": -2.25, "c": 0.125, "d": 3.0}


def initial() -> dict[str, Any]:
    return {
        "params": {k: 0.0 for k in TARGET},
        "velocity": [0.0] * len(TARGET),
        "rng": random.Random(7),
        "records": [],
    }


def work(state: dict[str, Any], step: int) -> dict[str, Any]:
    """One iteration: a noisy gradient from the private generator, a jitter from the global
    one (so both streams must continue exactly), momentum, and a record of it all."""
    rng: random.Random = state["rng"]
    jitter = random.random()
    loss = 0.0
    for i, (k, target) in enumerate(TARGET.items()):
        diff = state["params"][k] - target
        loss += diff * diff
        grad = 2 * diff + rng.gauss(0.0, 0.1)
        state["velocity"][i] = 0.9 * state["velocity"][i] + grad
        state["params"][k] -= (0.01 + 0.001 * jitter) * state["velocity"][i]
    state["records"].append(f"{step} {loss.hex()} {jitter.hex()} {rng.random().hex()}")
    return state


def save_fn(path: str, state: dict[str, Any]) -> None:
    with open(os.path.join(path, "state.json"), "w") as f:
        json.dump({"params": state["params"], "velocity": state["velocity"]}, f)
    os.makedirs(os.path.join(path, "rng"))
    with open(os.path.join(path, "rng", "private.json"), "w") as f:
        json.dump(state["rng"].getstate(), f)
    with open(os.path.join(path, "records.txt"), "w") as f:
        f.write("".join(r + "\n" for r in state["records"]))


def restore_fn(path: str) -> dict[str, Any]:
    with open(os.path.join(path, "state.json")) as f:
        doc = json.load(f)
    with open(os.path.join(path, "rng", "private.json")) as f:
        version, internal, gauss_next = json.load(f)
    rng = random.Random()
    rng.setstate((version, tuple(internal), gauss_next))
    with open(os.path.join(path, "records.txt")) as f:
        records = f.read().splitlines()
    return {"params": doc["params"], "velocity": doc["velocity"], "rng": rng, "records": records}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--signal-at", type=int, default=-1, help="send SIGUSR1 to self at this step")
    p.add_argument("--kill-at", type=int, default=-1, help="SIGKILL self here (a crash)")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--reseed-after-restore", action="store_true", help="break the global stream")
    args = p.parse_args()

    random.seed(0)  # before restore: ferry puts the saved global stream back over it
    ckpt = ferry.FunctionCheckpoint(save_fn, restore_fn)
    state = ckpt.restore(default=initial())
    if args.reseed_after_restore:
        random.seed(0)
    if ferry.resumed:
        print(f"resumed at step {ckpt.global_step} (restored_step {ferry.restored_step})", flush=True)
    while ckpt.global_step < args.steps:
        step = ckpt.global_step
        if step == args.signal_at:
            os.kill(os.getpid(), signal.SIGUSR1)
        if step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        state = work(state, step)
        ckpt.step(state)
        if args.sleep:
            time.sleep(args.sleep)

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, STEPS), "w") as f:
        f.write("".join(r + "\n" for r in state["records"]))
    with open(os.path.join(args.out, VALUE), "w") as f:
        for k, v in state["params"].items():
            f.write(f"param {k} {v.hex()}\n")
        f.write("velocity " + " ".join(v.hex() for v in state["velocity"]) + "\n")
        f.write(f"private-rng-next {state['rng'].random().hex()}\n")
        f.write(f"global-rng-next {random.random().hex()}\n")


if __name__ == "__main__":
    main()
