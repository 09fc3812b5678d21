"""An unmodified script (it never imports ferry) with the loader idioms zero-code mode must
tell apart: a step loop over a shuffled training loader, an evaluate() that builds a new
test loader at every call, prints "Test: N/M correct" and saves the best model; random
augmentation in Dataset.__getitem__ (torch, random and numpy, in the DataLoader's workers
with --workers N); with --epochs N, an epoch loop that builds its training loader anew
each epoch; with --stateful, a loader that keeps its own position through
StatefulDataLoader's protocol (torchdata's own class with --torchdata).

The test stops it at chosen steps through FERRY_TEST_STOP_AT (comma-separated steps): the
script sends its own process a stop signal there, as a scheduler would, and ferry stops at
the next safe point, deterministically, without a sleep. Reference runs never set it.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Points(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, augment: bool) -> None:
        self.x, self.y, self.augment = x, y, augment

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[i]
        if self.augment:  # a random "crop" and "flip", as image pipelines do
            x = x + 0.05 * torch.randn_like(x)
            if random.random() < 0.5:
                x = x.flip(0)
            x = x * float(np.random.uniform(0.9, 1.1))
        return x, self.y[i]


class CountingLoader(DataLoader[Any]):
    """StatefulDataLoader's protocol, in miniature: its own __iter__ (DataLoader's is never
    called), state_dict() with the epoch's shuffle state and the batches it yielded, and
    load_state_dict() that makes the next iter() resume there."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._yielded = 0
        self._epoch_gen: torch.Tensor | None = None
        self._resume: dict[str, Any] | None = None

    def __iter__(self) -> Any:
        assert self.generator is not None
        skip = 0
        if self._resume is not None:
            self.generator.set_state(self._resume["gen"])
            skip, self._resume = int(self._resume["yielded"]), None
        self._epoch_gen = self.generator.get_state()
        self._yielded = skip
        return _Counting(self, self._get_iterator(), skip)

    def state_dict(self) -> dict[str, Any]:
        return {"gen": self._epoch_gen, "yielded": self._yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = state


class _Counting:
    def __init__(self, loader: CountingLoader, it: Any, skip: int) -> None:
        self.loader, self.it = loader, it
        for _ in range(skip):
            next(self.it)

    def __iter__(self) -> _Counting:
        return self

    def __next__(self) -> Any:
        batch = next(self.it)
        self.loader._yielded += 1
        return batch


test_loader: DataLoader[Any] | None = None


def evaluate(model: nn.Module, test_set: Points, log: Any) -> int:
    global test_loader
    test_loader = DataLoader(test_set, batch_size=10)  # a new loader at every call, kept till the next
    model.eval()
    correct = seen = 0
    with torch.no_grad():
        for x, y in test_loader:
            correct += int((model(x).argmax(1) == y).sum())
            seen += len(y)
    model.train()
    log.write(f"Test: {correct}/{seen} correct\n")
    return correct


def make_loader(data: Points, kwargs: dict[str, Any]) -> DataLoader[Any]:
    return DataLoader(data, **kwargs)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--augment", action="store_true")
    p.add_argument("--stateful", action="store_true")
    p.add_argument("--torchdata", action="store_true")
    p.add_argument("--epochs", type=int, default=0, help="an epoch loop, the loader built in it")
    args = p.parse_args()
    # A frozenset, which zero-code mode leaves as each run makes it: a set of the loop's frames
    # is restored as saved (the loop may add to it), which would give a resume the stops of
    # the run it resumes instead of its own.
    stops = frozenset(int(s) for s in os.environ.get("FERRY_TEST_STOP_AT", "").split(",") if s)
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    x = torch.randn(110, 6)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.3).long()
    train_set, test_set = Points(x[:80], y[:80], args.augment), Points(x[80:], y[80:], False)
    kwargs: dict[str, Any] = {"batch_size": args.batch_size, "shuffle": True, "num_workers": args.workers}
    model = nn.Sequential(nn.Linear(6, 24), nn.ReLU(), nn.Dropout(0.2), nn.Linear(24, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.02 * s))
    os.makedirs(args.out, exist_ok=True)
    best_path = os.path.join(args.out, "best.pt")
    best = [torch.load(best_path)["correct"] if os.path.exists(best_path) else -1]
    log = open(os.path.join(args.out, "log.txt"), "a")  # noqa: SIM115

    def train_step(xb: torch.Tensor, yb: torch.Tensor) -> None:
        loss = nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        step = sched.last_epoch
        log.write(f"{step} {loss.item().hex()} {xb.sum().item().hex()}\n")
        log.flush()
        if step % args.eval_every == 0:
            correct = evaluate(model, test_set, log)
            if correct > best[0]:
                best[0] = correct
                torch.save({"correct": correct, "model": model.state_dict()}, best_path)
            log.flush()
        if step in stops:
            os.kill(os.getpid(), signal.SIGUSR1)

    if args.epochs:
        for _epoch in range(args.epochs):
            epoch_loader = make_loader(train_set, kwargs)  # built anew each epoch
            for xb, yb in epoch_loader:
                train_step(xb, yb)
    else:
        if args.torchdata:
            from torchdata.stateful_dataloader import StatefulDataLoader

            train: DataLoader[Any] = StatefulDataLoader(train_set, **kwargs)
        elif args.stateful:
            train = CountingLoader(train_set, generator=torch.Generator().manual_seed(1), **kwargs)
        else:
            train = make_loader(train_set, kwargs)
        it = iter(train)
        while sched.last_epoch < args.steps:  # the step budget lives in the scheduler
            try:
                xb, yb = next(it)
            except StopIteration:
                it = iter(train)
                xb, yb = next(it)
            train_step(xb, yb)
    with open(os.path.join(args.out, "params.txt"), "w") as f:
        for name, t in model.state_dict().items():
            f.write(f"{name} {t.numpy().tobytes().hex()}\n")


if __name__ == "__main__":
    main()
