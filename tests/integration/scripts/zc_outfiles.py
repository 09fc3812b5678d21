"""A script that opens its log with "w" at the top, writes a banner and an evaluation before
training, and appends a CSV row per epoch through a file it reopens (it never imports
ferry). Resumed, it runs from the top again: the log must come back as it was at the
checkpoint, not truncated, and no line may be written twice."""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--sleep", type=float, default=0.0)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    main_log = open(os.path.join(args.out, "main.log"), "w")  # noqa: SIM115
    main_log.write(f"config: epochs={args.epochs}\n")
    torch.manual_seed(4)
    x = torch.randn(64, 4)
    y = x @ torch.randn(4, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with torch.no_grad():
        main_log.write(f"initial loss {nn.functional.mse_loss(model(x), y).item():.6f}\n")
    with open(os.path.join(args.out, "log.txt"), "a") as progress:
        for epoch in range(args.epochs):
            for i, (xb, yb) in enumerate(loader):
                loss = nn.functional.mse_loss(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                main_log.write(f"epoch {epoch} batch {i} loss {loss.item():.6f}\n")
                progress.write(f"{epoch} {i}\n")
                progress.flush()
                time.sleep(args.sleep)
            with open(os.path.join(args.out, "summary.csv"), "a") as summary:
                summary.write(f"{epoch},{loss.item():.6f}\n")
    main_log.write("done\n")
    main_log.close()


if __name__ == "__main__":
    main()
