"""An unmodified script in the shape of pytorch/examples' mnist (it never imports ferry):
`for batch_idx, (data, target) in enumerate(train_loader)` with progress lines that show
the index, an early `break`, a test() per epoch, StepLR, and the script's own per-epoch
torch.save."""

from __future__ import annotations

import argparse
import os
import signal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STOP_AT = {int(s) for s in os.environ.get("ZC_STOP_AT", "").split(",") if s}


def train(args, model, train_loader, optimizer, epoch):  # type: ignore[no-untyped-def]
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            done, total = batch_idx * len(data), len(train_loader.dataset)
            pct = 100.0 * batch_idx / len(train_loader)
            print(f"Train Epoch: {epoch} [{done}/{total} ({pct:.0f}%)]\tLoss: {loss.item():.8f}")
        if epoch * 100 + batch_idx in STOP_AT:  # the tests' stand-in for a scheduler's SIGTERM
            os.kill(os.getpid(), signal.SIGTERM)
        if batch_idx >= args.max_steps:
            break


def test(model, test_loader):  # type: ignore[no-untyped-def]
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            correct += int((model(data).argmax(1) == target).sum())
    n = len(test_loader.dataset)
    print(f"Test set: Accuracy: {correct}/{n} ({100.0 * correct / n:.0f}%)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=4)
    p.add_argument("--log-interval", type=int, default=1)
    args = p.parse_args()
    torch.manual_seed(1)
    x = torch.randn(80, 6)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    train_loader = DataLoader(TensorDataset(x[:48], y[:48]), batch_size=8, shuffle=True)
    test_loader = DataLoader(TensorDataset(x[48:], y[48:]), batch_size=16)
    model = nn.Sequential(nn.Linear(6, 24), nn.ReLU(), nn.Dropout(0.2), nn.Linear(24, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    os.makedirs(args.out, exist_ok=True)
    for epoch in range(1, args.epochs + 1):
        train(args, model, train_loader, optimizer, epoch)
        test(model, test_loader)
        scheduler.step()
        torch.save(model.state_dict(), os.path.join(args.out, f"model-epoch{epoch}.pt"))
    with open(os.path.join(args.out, "params.txt"), "w") as f:
        for name, t in model.state_dict().items():
            f.write(f"{name} {t.numpy().tobytes().hex()}\n")


if __name__ == "__main__":
    main()
