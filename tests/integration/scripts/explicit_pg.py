"""Explicit mode in a process that made a 1-rank gloo group of its own (as a DTensor model
needs): `ferry.checkpoint()` after fast steps, and one just before `ferry.close()`."""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist

import ferry


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--after", type=int, default=200, help="steps after the request (0: close at once)")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ferry.track(model=model, opt=opt)

    def steps(n: int) -> None:
        for _ in range(n):
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            ferry.step()

    steps(args.warmup)
    ferry.checkpoint()
    steps(args.after)
    ferry.close()
    print(sorted(n for n in os.listdir(os.environ["FERRY_DIR"]) if n.startswith("step-")))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
