"""A multi-rank job (torchrun, gloo on CPU) whose state is no PyTorch object: each rank keeps
its own value in a ``ferry.FunctionCheckpoint``. Rank R's value depends on R, so a rank that
resumed from another rank's files (or from none) ends with another value.

``--raise-at N`` makes rank 1 raise an exception of the script's own at step N while rank 0
trains on (into ferry's agreement at its next safe point); with ``--linger`` a non-daemon
thread keeps rank 1's process alive after that, so torchrun does not notice it failed. The
job must end promptly, naming the cause, instead of leaving rank 0 blocked until the process
group's timeout.

Writes ``rank<R>.txt`` (the final value) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Any

import torch.distributed as dist
from gloo_exit import skip_finalization

import ferry


def save_fn(path: str, value: dict[str, Any]) -> None:
    with open(os.path.join(path, "value.json"), "w") as f:
        json.dump(value, f)


def restore_fn(path: str) -> dict[str, Any]:
    with open(os.path.join(path, "value.json")) as f:
        value: dict[str, Any] = json.load(f)
    return value


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--raise-at", type=int, default=-1)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--linger", action="store_true", help="a non-daemon thread keeps rank 1 alive")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.linger and rank == 1:  # an uploader, say: the interpreter waits for it at exit
        threading.Thread(target=time.sleep, args=(3600,), name="uploader").start()
    ckpt = ferry.FunctionCheckpoint(save_fn, restore_fn)
    value = ckpt.restore(default={"rank": rank, "total": rank * 1000})
    if ferry.resumed:
        print(f"rank {rank} resumed at step {ckpt.global_step}", flush=True)
    while ckpt.global_step < args.steps:
        step = ckpt.global_step
        if rank == 1 and step == args.raise_at:
            raise ValueError(f"the script's own failure on rank 1 at step {step}")
        value = {"rank": value["rank"], "total": value["total"] * 3 + step + value["rank"]}
        ckpt.step(value)
        if args.sleep:
            time.sleep(args.sleep)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.txt"), "w") as f:
        f.write(json.dumps(value) + "\n")
    ferry.close()  # the session lets go of the group before the group goes
    dist.barrier()  # no rank tears gloo down under another still talking to it
    skip_finalization()


if __name__ == "__main__":
    main()
