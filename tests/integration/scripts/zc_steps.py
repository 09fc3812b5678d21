"""An unmodified step-budget loop with iter()/next() (it never imports ferry). The budget
lives in the LR scheduler (total_steps), which zero-code mode restores; a plain
`for step in range(N)` counter would not be (see docs/zero-code.md)."""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

RNG = np.random.default_rng(0)
SPLIT = np.random.default_rng(1)  # used only while setting up: resumes the same without ferry


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--amp", action="store_true")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--numpy-generator", action="store_true", help="noise from a global Generator")
    args = p.parse_args()
    torch.manual_seed(3)
    np.random.seed(3)
    x = torch.randn(100, 6)[torch.from_numpy(SPLIT.permutation(100))]
    y = x @ torch.randn(6, 1) + 0.1 * torch.randn(100, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, drop_last=True)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 1))
    if args.compile:
        model = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=args.steps)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10) if args.amp else None
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "log.txt"), "a")  # noqa: SIM115
    it = iter(loader)
    while sched.last_epoch < args.steps:
        try:
            xb, yb = next(it)
        except StopIteration:
            it = iter(loader)
            xb, yb = next(it)
        noise = RNG.standard_normal(xb.shape) if args.numpy_generator else np.random.randn(*xb.shape)
        xb = xb + 0.01 * torch.from_numpy(noise.astype(np.float32))
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        sched.step()
        log.write(f"{sched.last_epoch} {loss.item().hex()}\n")
        log.flush()
        if args.sleep:
            time.sleep(args.sleep)
    with open(os.path.join(args.out, "params.txt"), "w") as f:
        for name, t in model.state_dict().items():
            f.write(f"{name} {t.numpy().tobytes().hex()}\n")
        if scaler is not None:
            f.write(f"scale {scaler.get_scale()}\n")


if __name__ == "__main__":
    main()
