"""An epoch loop that evaluates on its own (shuffled) training loader at each epoch's end,
a common idiom (it never imports ferry): those batches train nothing, so they are neither
steps nor places to checkpoint, and the random draws they make happen in a resume too."""

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
    p.add_argument("--eval-sleep", type=float, default=0.0)
    args = p.parse_args()
    torch.manual_seed(9)
    x = torch.randn(80, 5)
    y = (x[:, :2].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=10, shuffle=True)
    model = nn.Sequential(nn.Linear(5, 10), nn.ReLU(), nn.Dropout(0.1), nn.Linear(10, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "log.txt"), "a")  # noqa: SIM115
    steps = 0
    for epoch in range(args.epochs):
        model.train()
        for xb, yb in loader:
            loss = nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            log.write(f"train {epoch} {steps} {loss.item().hex()}\n")
            log.flush()
            time.sleep(args.sleep)
        model.eval()
        correct = 0
        with torch.no_grad():
            for xb, yb in loader:  # the training loader again: a pass that trains nothing
                correct += int((model(xb).argmax(1) == yb).sum())
                time.sleep(args.eval_sleep)
        log.write(f"eval {epoch} {correct}\n")
        log.flush()
    print(f"trained {steps} steps")
    with open(os.path.join(args.out, "params.txt"), "w") as f:
        for name, t in model.state_dict().items():
            f.write(f"{name} {t.numpy().tobytes().hex()}\n")


if __name__ == "__main__":
    main()
