"""An epoch loop whose evaluation loader keeps a persistent worker pool, made at the first
evaluation (it never imports ferry). Making a pool draws a base seed from the global torch
RNG, once: a resumed process that makes it again must not shift the shuffles after it."""

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
    p.add_argument("--train-workers", type=int, default=0, help="a persistent pool for training too")
    args = p.parse_args()
    torch.manual_seed(5)
    x = torch.randn(96, 6)
    y = (x[:, 0] > 0).long()
    train = DataLoader(
        TensorDataset(x[:64], y[:64]),
        batch_size=8,
        shuffle=True,
        num_workers=args.train_workers,
        persistent_workers=args.train_workers > 0,
    )
    evaluation = DataLoader(
        TensorDataset(x[64:], y[64:]), batch_size=16, num_workers=2, persistent_workers=True
    )
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Dropout(0.2), nn.Linear(12, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "log.txt"), "a") as log:
        for epoch in range(args.epochs):
            model.train()
            for xb, yb in train:
                loss = nn.functional.cross_entropy(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                log.write(f"{epoch} {loss.item().hex()} {yb.tolist()}\n")
                log.flush()
                time.sleep(args.sleep)
            model.eval()
            with torch.no_grad():
                correct = sum(int((model(xb).argmax(1) == yb).sum()) for xb, yb in evaluation)
            log.write(f"eval {epoch} {correct}\n")
    with open(os.path.join(args.out, "params.txt"), "w") as f:
        for name, t in model.state_dict().items():
            f.write(f"{name} {t.numpy().tobytes().hex()}\n")


if __name__ == "__main__":
    main()
