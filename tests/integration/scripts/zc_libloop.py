"""A script whose training loop runs in a library's engine (it never imports ferry)."""

from __future__ import annotations

import argparse
import os
import time

import torch
from enginelib import Engine
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--sleep", type=float, default=0.0)
    args = p.parse_args()
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = x.sum(1, keepdim=True)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "log.txt"), "a") as f:

        def log(epoch: int, iteration: int, loss: float) -> None:
            f.write(f"{epoch} {iteration} {loss:.6f}\n")
            f.flush()
            time.sleep(args.sleep)

        Engine(model, opt, DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)).run(3, log)


if __name__ == "__main__":
    main()
