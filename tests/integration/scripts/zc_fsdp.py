"""An unmodified FSDP2 training script for torchrun (it never imports ferry): parameters
sharded across ranks as DTensors, gloo on CPU, DistributedSampler, a per-epoch scheduler.
Rank 0 writes the full (gathered) final parameters."""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from gloo_exit import skip_finalization
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--hold-at", type=int, default=-1, help="after this step, wait for --release")
    p.add_argument("--release", default="", help="the file a test creates to end the hold")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(11)
    x = torch.randn(128, 12)
    y = (x[:, :3].sum(1) > 0).long()
    sampler = DistributedSampler(TensorDataset(x, y), shuffle=True, seed=5)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, sampler=sampler)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    out = os.path.join(args.out, f"rank{rank}")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "log.txt"), "a") as log:
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for xb, yb in loader:
                loss = nn.functional.cross_entropy(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                step = int(opt.state[next(model.parameters())]["step"])
                log.write(f"{step} {loss.item().hex()}\n")
                log.flush()
                if args.sleep:
                    time.sleep(args.sleep)
                if step == args.hold_at:  # a test's handshake (it signals a rank meanwhile)
                    give_up = time.monotonic() + 300
                    while not os.path.exists(args.release) and time.monotonic() < give_up:
                        time.sleep(0.02)
            sched.step()
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    if rank == 0:
        with open(os.path.join(args.out, "params.txt"), "w") as f:
            for name, t in full.items():
                f.write(f"{name} {t.numpy().tobytes().hex()}\n")
    dist.barrier()  # no rank tears gloo down under another still talking to it
    dist.destroy_process_group()
    skip_finalization()


if __name__ == "__main__":
    main()
