"""An unmodified script (it never imports ferry) with what zero-code mode cannot capture:
a list of the script's own objects that the loop appends to, and a `for` loop over the
script's own generator, one that does not wrap the loader (the loop asks the loader itself;
a generator that wraps it runs at the safe point and is captured). (A list of floats,
``losses``, is captured.)"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def numbered(n: int):  # type: ignore[no-untyped-def]
    yield from range(n)


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
    batches = iter(loader)
    for _ in numbered(len(loader)):
        xb, yb = next(batches)
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        stats.append(Stat(loss.item()))
    print(len(losses), len(stats))


if __name__ == "__main__":
    main()
