"""An unmodified script (it never imports ferry) with what zero-code mode cannot capture:
a list of the script's own objects that the loop appends to, and a `for` loop over the
script's own generator. (A list of floats, ``losses``, is captured.)"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def batches(loader):  # type: ignore[no-untyped-def]
    yield from loader


class Stat:
    def __init__(self, loss: float) -> None:
        self.loss = loss


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(32, 3)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    stats = []
    for xb, yb in batches(loader):
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        stats.append(Stat(loss.item()))
    print(len(losses), len(stats))


if __name__ == "__main__":
    main()
