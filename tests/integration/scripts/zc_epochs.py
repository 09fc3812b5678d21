"""An unmodified training script in the most common idiom (it never imports ferry):
epochs, a train() and a test() function, scheduler.step() once per epoch."""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def train(model, loader, optimizer, log, sleep):  # type: ignore[no-untyped-def]
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        step = int(optimizer.state[next(model.parameters())]["step"])
        log.write(f"{step} {loss.item().hex()} {torch.rand(1).item().hex()}\n")
        log.flush()
        if sleep:
            import time

            time.sleep(sleep)


def test(model, loader, log):  # type: ignore[no-untyped-def]
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            correct += int((model(x).argmax(1) == y).sum())
    log.write(f"test {correct}\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--sleep", type=float, default=0.0)
    args = p.parse_args()
    torch.manual_seed(7)
    data = torch.randn(160, 10)
    labels = (data[:, 0] > 0).long() + (data[:, 1] > 0.5).long()
    train_loader = DataLoader(
        TensorDataset(data[:128], labels[:128]), batch_size=8, shuffle=True, num_workers=args.workers
    )
    test_loader = DataLoader(TensorDataset(data[128:], labels[128:]), batch_size=16)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "log.txt"), "a") as log:
        for _epoch in range(args.epochs):
            train(model, train_loader, optimizer, log, args.sleep)
            test(model, test_loader, log)
            scheduler.step()
    with open(os.path.join(args.out, "params.txt"), "w") as f:
        for name, t in model.state_dict().items():
            f.write(f"{name} {t.numpy().tobytes().hex()}\n")
        f.write(f"lr {scheduler.get_last_lr()}\n")


if __name__ == "__main__":
    main()
