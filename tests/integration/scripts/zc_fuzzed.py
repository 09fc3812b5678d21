"""An unmodified script (it never imports ferry) holding every kind of state zero-code mode
keeps in the loop's frames: module globals (a counter, a float, modules, functions,
classes), a function's locals and arguments (the model, the optimizer, a closure's
cells), a list and a dict, an object of the script's classes with a nested one (scalars, a
list, a dict, a NumPy array), ``range`` and ``enumerate(loader)`` loops. The frame-state
fuzzer (fuzz_frames.py) checkpoints it mid-epoch and resumes it with that state mutated.
Stops are SIGTERMs it sends itself after the steps in ``ZC_STOP_AT``."""

from __future__ import annotations

import os
import signal
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STOP_AT = frozenset(int(s) for s in os.environ.get("ZC_STOP_AT", "").split(",") if s)
seen_batches = 0
lr = 0.05


class Inner:
    def __init__(self) -> None:
        self.best = 1e9
        self.flags = {"warm": True}


class Meter:
    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.history: list[float] = []
        self.tag = "meter"
        self.inner = Inner()
        self.arr = np.zeros(3)


def train(model: nn.Module, opt: Any, loader: DataLoader[Any], meter: Meter, results: list[Any]) -> None:
    global seen_batches
    scale = 2

    def lr_at(epoch: int) -> float:  # a closure over a local and an argument: cells
        return lr * scale / (1 + epoch) + 0 * meter.count

    for epoch in range(3):
        for group in opt.param_groups:
            group["lr"] = lr_at(epoch)
        for i, (x, y) in enumerate(loader):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen_batches += 1
            meter.count += 1
            meter.total += loss.item()
            meter.history.append(round(loss.item(), 6))
            meter.arr += 1
            meter.inner.best = min(meter.inner.best, loss.item())
            results.append((epoch, i))
            print(f"{epoch} {i} {loss.item():.8f} {meter.count} {seen_batches}")
            if seen_batches in STOP_AT:
                os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(24, 3)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4, shuffle=True)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    meter = Meter()
    results: list[Any] = []
    history = {"runs": 1}
    train(model, opt, loader, meter, results)
    print("done", meter.count, len(results), history)


if __name__ == "__main__":
    main()
