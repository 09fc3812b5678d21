"""A timm-style training script (the shape of timm's train.py, on tiny synthetic data; it
never imports ferry): ``train_one_epoch`` with a ``_forward`` closure over its arguments,
AverageMeters, a prefetching generator wrapper that normalizes on the fly, persistent
workers, an evaluation loader, a per-update scheduler with its own ``step_update``, a
summary CSV appended each epoch and a checkpoint saver that keeps the best epochs."""

from __future__ import annotations

import argparse
import csv
import math
import os
import time
from collections import OrderedDict
from contextlib import suppress
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Noisy(Dataset[tuple[torch.Tensor, int]]):
    """Random crops and flips in __getitem__ (with workers: their own random streams)."""

    def __init__(self, n: int, train: bool) -> None:
        g = torch.Generator().manual_seed(7 if train else 8)
        self.x = torch.randn(n, 3, 10, 10, generator=g)
        self.y = (self.x.mean(dim=(1, 2, 3)) > 0).long()
        self.train = train

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = self.x[i]
        if self.train:
            top, left = torch.randint(0, 3, (2,)).tolist()
            x = x[:, top : top + 8, left : left + 8]
            if torch.rand(()) < 0.5:
                x = x.flip(-1)
        else:
            x = x[:, 1:9, 1:9]
        return x, int(self.y[i])


class PrefetchLoader:
    """timm's PrefetchLoader, on the CPU: holds the next batch while the current one trains."""

    def __init__(self, loader: DataLoader[Any], mean: float = 0.1, std: float = 0.9) -> None:
        self.loader, self.mean, self.std = loader, mean, std

    def __iter__(self) -> Any:
        first = True
        input = target = None
        for next_input, next_target in self.loader:
            next_input = next_input.float().sub_(self.mean).div_(self.std)
            if not first:
                yield input, target
            else:
                first = False
            input, target = next_input, next_target
        yield input, target

    def __len__(self) -> int:
        return len(self.loader)


class AverageMeter:
    def __init__(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


class CosineScheduler:
    """timm's scheduler protocol: ``step(epoch)`` and ``step_update(num_updates)``."""

    def __init__(self, optimizer: torch.optim.Optimizer, t_initial: int, warmup: int = 3) -> None:
        self.optimizer, self.t_initial, self.warmup = optimizer, t_initial, warmup
        self.base = [g["lr"] for g in optimizer.param_groups]

    def _at(self, t: int) -> list[float]:
        if t < self.warmup:
            return [b * (t + 1) / self.warmup for b in self.base]
        return [0.5 * b * (1 + math.cos(math.pi * t / self.t_initial)) for b in self.base]

    def step_update(self, num_updates: int) -> None:
        for group, lr in zip(self.optimizer.param_groups, self._at(num_updates), strict=True):
            group["lr"] = lr

    def step(self, epoch: int) -> None:
        pass


def train_one_epoch(
    epoch: int,
    model: nn.Module,
    loader: Any,
    optimizer: torch.optim.Optimizer,
    loss_fn: nn.Module,
    args: argparse.Namespace,
    lr_scheduler: CosineScheduler | None = None,
    amp_autocast: Any = suppress,
    log: Any = None,
) -> OrderedDict[str, float]:
    losses_m = AverageMeter()
    model.train()
    last_idx = len(loader) - 1
    num_updates = epoch * len(loader)

    def _forward(input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        with amp_autocast():
            output = model(input)  # `model` and `loss_fn` are cells: closed over arguments
            return loss_fn(output, target)

    for batch_idx, (input, target) in enumerate(loader):
        last_batch = batch_idx == last_idx
        loss = _forward(input, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        num_updates += 1
        losses_m.update(loss.item(), input.size(0))
        if last_batch or batch_idx % args.log_interval == 0:
            lrl = [g["lr"] for g in optimizer.param_groups]
            line = (
                f"Train: {epoch} [{batch_idx:>3d}/{len(loader)}] Loss: {losses_m.val:#.4g} "
                f"({losses_m.avg:#.4g}) LR: {lrl[0]:.3e}"
            )
            print(line, flush=True)
            log.write(line + "\n")
            log.flush()
        if lr_scheduler is not None:
            lr_scheduler.step_update(num_updates=num_updates)
        if args.sleep:
            time.sleep(args.sleep)
    return OrderedDict([("loss", losses_m.avg)])


def validate(model: nn.Module, loader: Any, loss_fn: nn.Module) -> OrderedDict[str, float]:
    losses_m, top1_m = AverageMeter(), AverageMeter()
    model.eval()
    with torch.no_grad():
        for input, target in loader:
            output = model(input)
            losses_m.update(loss_fn(output, target).item(), input.size(0))
            top1_m.update((output.argmax(-1) == target).float().mean().item() * 100, input.size(0))
    return OrderedDict([("loss", losses_m.avg), ("top1", top1_m.avg)])


def update_summary(epoch: int, train: dict[str, float], evals: dict[str, float], filename: str) -> None:
    row = OrderedDict(epoch=epoch)
    row.update([("train_" + k, v) for k, v in train.items()])
    row.update([("eval_" + k, v) for k, v in evals.items()])
    new = not os.path.exists(filename)
    with open(filename, mode="a") as f:
        writer = csv.DictWriter(f, fieldnames=row.keys())
        if new:
            writer.writeheader()
        writer.writerow(row)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="output")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--log-interval", type=int, default=2)
    p.add_argument("--sleep", type=float, default=0.0)
    args = p.parse_args()
    torch.manual_seed(42)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Dropout(0.1),
        nn.Linear(32, 2),
    )  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    train_loader = PrefetchLoader(
        DataLoader(
            Noisy(96, True),
            batch_size=8,
            shuffle=True,
            num_workers=args.workers,
            persistent_workers=args.workers > 0,
            drop_last=True,
        )
    )
    eval_loader = PrefetchLoader(
        DataLoader(
            Noisy(32, False), batch_size=16, num_workers=args.workers, persistent_workers=args.workers > 0
        )
    )
    lr_scheduler = CosineScheduler(optimizer, t_initial=args.epochs * len(train_loader))
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "log.txt"), "a")  # noqa: SIM115
    best_metric, best_epoch = None, None
    for epoch in range(args.epochs):
        train_metrics = train_one_epoch(
            epoch, model, train_loader, optimizer, loss_fn, args, lr_scheduler=lr_scheduler, log=log
        )
        eval_metrics = validate(model, eval_loader, loss_fn)
        lr_scheduler.step(epoch + 1)
        update_summary(epoch, train_metrics, eval_metrics, os.path.join(args.out, "summary.csv"))
        if best_metric is None or eval_metrics["top1"] > best_metric:
            best_metric, best_epoch = eval_metrics["top1"], epoch
            torch.save(model.state_dict(), os.path.join(args.out, "model_best.pth.tar"))
        print(
            f"Epoch {epoch}: eval loss {eval_metrics['loss']:#.4g} top1 {eval_metrics['top1']:.2f}",
            flush=True,
        )
    print(f"*** Best metric: {best_metric} (epoch {best_epoch})", flush=True)
    with open(os.path.join(args.out, "params.txt"), "w") as f:
        for name, t in model.state_dict().items():
            f.write(f"{name} {t.numpy().tobytes().hex()}\n")


if __name__ == "__main__":
    main()
