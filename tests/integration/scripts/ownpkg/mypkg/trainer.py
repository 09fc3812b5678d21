"""A trainer in the user's own package: the step counter is a plain attribute,
``self.iter_num``, the budget ``max_iters``; batches come from next() on a loader whose
RandomSampler draws with replacement, re-created on StopIteration."""

from __future__ import annotations

import os
import signal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

STOP_AT = {int(s) for s in os.environ.get("ZC_STOP_AT", "").split(",") if s}


class Trainer:
    def __init__(self, max_iters: int) -> None:
        torch.manual_seed(0)
        x = torch.randn(96, 5)
        y = (x[:, :2].sum(1) > 0).long()
        data = TensorDataset(x, y)
        self.loader = DataLoader(
            data, batch_size=8, sampler=RandomSampler(data, replacement=True, num_samples=40)
        )
        self.model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.iter_num = 0
        self.best_loss = 1e9
        self.max_iters = max_iters

    def run(self) -> None:
        data_iter = iter(self.loader)
        while True:
            try:
                xb, yb = next(data_iter)
            except StopIteration:
                data_iter = iter(self.loader)
                xb, yb = next(data_iter)
            for group in self.opt.param_groups:
                group["lr"] = 1e-2 * (1 - self.iter_num / self.max_iters)
            loss = F.cross_entropy(self.model(xb), yb)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            self.best_loss = min(self.best_loss, loss.item())
            print(f"iter {self.iter_num}: loss {loss.item():.8f}, best {self.best_loss:.8f}")
            if self.iter_num in STOP_AT:  # the tests' stand-in for a scheduler's SIGTERM
                os.kill(os.getpid(), signal.SIGTERM)
            self.iter_num += 1
            if self.iter_num >= self.max_iters:
                break
