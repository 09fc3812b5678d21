"""An unmodified script (it never imports ferry) whose loop iterates generators that wrap
the DataLoader, nested: ``passed`` hands batches through (``yield from``), ``noisy`` adds
noise to each from the global random stream, and ``ahead`` holds the next batch while the
current one trains (timm's prefetcher, as a plain generator). The workers crop at random."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

Batch = tuple[torch.Tensor, torch.Tensor]


class Crops(Dataset[Batch]):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(3)
        self.x = torch.randn(n, 6, generator=g)
        self.y = self.x.sum(1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Batch:
        start = int(torch.randint(0, 3, ()))  # in a worker: the worker's own random stream
        x = torch.zeros(6)
        x[start:] = self.x[i, start:]
        return x, self.y[i]


def passed(loader: Iterable[Any]) -> Iterator[Any]:
    yield from loader


def noisy(batches: Iterable[Batch]) -> Iterator[Batch]:
    for x, y in batches:
        yield x + 0.05 * torch.randn_like(x), y


def ahead(batches: Iterable[Batch]) -> Iterator[Batch]:
    held = None
    for batch in batches:
        if held is not None:
            yield held
        held = batch
    if held is not None:
        yield held


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--sleep", type=float, default=0.0)
    args = p.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(Crops(32), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True)
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.1), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    for epoch in range(args.epochs):
        for i, (x, y) in enumerate(ahead(noisy(passed(loader)))):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            print(f"epoch {epoch} batch {i} step {step} loss {loss.item():.6f}", flush=True)
            time.sleep(args.sleep)
    with open("params.txt", "w") as f:
        for name, t in model.state_dict().items():
            f.write(f"{name} {t.numpy().tobytes().hex()}\n")


if __name__ == "__main__":
    main()
