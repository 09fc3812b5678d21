"""A small, ordinary PyTorch training script. It does not import ferry: run it under
`ferry run -- python examples/train.py` and it becomes preemptible and movable.

Synthetic data (no downloads), a small MLP, dropout, shuffling, AdamW, a per-epoch LR
schedule: the usual idiom. It writes its per-step losses and final weights to --out.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(n: int = 2048) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 20, generator=g)
    w = torch.randn(20, 4, generator=g)
    y = (x @ w).argmax(1)
    return TensorDataset(x, y)


def train_one_epoch(model, loader, optimizer, log, pause):  # type: ignore[no-untyped-def]
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        step = int(optimizer.state[next(model.parameters())]["step"])
        log.write(f"{step} {loss.item():.6f} {loss.item().hex()}\n")
        log.flush()
        time.sleep(pause)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="folder for losses.txt and weights.txt")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds per step (to watch it)")
    args = parser.parse_args()

    torch.manual_seed(1)
    loader = DataLoader(make_data(), batch_size=64, shuffle=True)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "losses.txt"), "a") as log:
        for _epoch in range(args.epochs):
            train_one_epoch(model, loader, optimizer, log, args.pause)
            scheduler.step()
    with open(os.path.join(args.out, "weights.txt"), "w") as f:
        for name, t in model.state_dict().items():
            f.write(f"{name} {t.numpy().tobytes().hex()}\n")


if __name__ == "__main__":
    main()
