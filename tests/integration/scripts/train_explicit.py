"""A training script in the usual idiom, with ferry's explicit API; every knob from argv.

Writes the per-step losses to LOSSES (one line per step: "step loss_hex") and the final
parameters to RESULT (a torch-free, exact hex dump), so runs can be compared bitwise.
"""

from __future__ import annotations

import argparse
import os
import random
import signal

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import ferry


class Points(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x.sum(1, keepdim=True) > 0).float()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--n", type=int, default=96)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--shuffle", type=int, default=1)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--optim", default="adamw", choices=["adamw", "sgd"])
    p.add_argument("--sched", default="step", choices=["step", "onecycle", "none"])
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--width", type=int, default=32, help="hidden units (32768: 1 MiB tensors)")
    p.add_argument("--signal-at", type=int, default=-1, help="send SIGUSR1 to self at this step")
    p.add_argument("--request-at", type=int, default=-1, help="ferry.checkpoint(stop=True) here")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--sleep-while", default="", help="sleep (--sleep) only while this file exists")
    p.add_argument(
        "--crawl-from",
        type=int,
        default=-1,
        help="from this step on, a step sleeps while --sleep-while exists, up to --crawl-for s (not --sleep):"
        " a test that holds the file keeps the job's last steps for itself however loaded the host",
    )
    p.add_argument("--crawl-for", type=float, default=3.0)
    p.add_argument("--signal-before-loop", action="store_true", help="SIGUSR1 before step 0")
    p.add_argument("--signal-twice", action="store_true", help="SIGUSR1 then SIGTERM at --signal-at")
    p.add_argument("--killpg-at", type=int, default=-1, help="SIGTERM to the process group")
    p.add_argument("--kill-at", type=int, default=-1, help="SIGKILL self here (a crash)")
    p.add_argument("--state-mb", type=int, default=0, help="extra tracked state, to make saves slow")
    p.add_argument("--hold-at", type=int, default=-1, help="at the end of this step, wait for --release")
    p.add_argument("--release", default="", help="the file that lets a step held by --hold-at go on")
    args = p.parse_args()

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    hidden = args.width
    model = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Dropout(args.dropout), nn.Linear(hidden, 1))
    if args.optim == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    loader = DataLoader(
        Points(args.n), batch_size=args.batch, shuffle=bool(args.shuffle), num_workers=args.workers
    )
    steps_per_epoch = len(loader)
    if args.sched == "step":
        sched: torch.optim.lr_scheduler.LRScheduler | None = torch.optim.lr_scheduler.StepLR(opt, 1, 0.7)
    elif args.sched == "onecycle":
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, 0.05, total_steps=args.epochs * steps_per_epoch)
    else:
        sched = None
    history: dict[str, list[str]] = {"losses": []}
    objs = {"model": model, "optimizer": opt, "history": history}
    if sched is not None:
        objs["scheduler"] = sched
    if args.state_mb:
        objs["ballast"] = {"w": torch.zeros(args.state_mb << 18)}
    ferry.track(loader=loader, **objs)

    os.makedirs(args.out, exist_ok=True)
    if args.signal_before_loop and not ferry.resumed:
        os.kill(os.getpid(), signal.SIGUSR1)
    for _epoch in range(args.epochs):
        for x, y in loader:
            step = ferry.global_step
            if step == args.signal_at:
                os.kill(os.getpid(), signal.SIGUSR1)
                if args.signal_twice:
                    os.kill(os.getpid(), signal.SIGTERM)
            if step == args.killpg_at:
                os.killpg(os.getpgid(0), signal.SIGTERM)
            if step == args.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if step == args.request_at:
                ferry.checkpoint(stop=True)
            loss = nn.functional.binary_cross_entropy_with_logits(model(x), y) / args.accum
            loss.backward()
            if ferry.global_step % args.accum == 0:  # enumerate's index restarts on resume
                opt.step()
                opt.zero_grad()
                if args.sched == "onecycle" and sched is not None:
                    sched.step()
            noise = torch.rand(1).item() + random.random() + float(np.random.rand())
            history["losses"].append(f"{step} {loss.item().hex()} {noise.hex()}")
            if args.sleep and (not args.sleep_while or os.path.exists(args.sleep_while)):
                import time

                if 0 <= args.crawl_from <= step:  # ends as soon as the file goes: a safe point comes
                    until = time.monotonic() + args.crawl_for
                    while os.path.exists(args.sleep_while) and time.monotonic() < until:
                        time.sleep(0.02)
                else:
                    time.sleep(args.sleep)
            if step == args.hold_at:  # a test's handshake: no race against the wall clock
                import time

                give_up = time.monotonic() + 300  # a test that failed never releases it
                while not os.path.exists(args.release) and time.monotonic() < give_up:
                    time.sleep(0.02)
        if args.sched == "step" and sched is not None:
            sched.step()
    with open(os.path.join(args.out, "losses.txt"), "w") as f:
        f.write("\n".join(history["losses"]) + "\n")
    with open(os.path.join(args.out, "params.txt"), "w") as f:
        for name, t in model.state_dict().items():
            f.write(f"{name} {t.numpy().tobytes().hex()}\n")
        for k, v in sorted(opt.state_dict()["state"].items()):
            for kk, vv in sorted(v.items()):
                f.write(f"opt {k} {kk} {vv.numpy().tobytes().hex()}\n")


if __name__ == "__main__":
    main()
