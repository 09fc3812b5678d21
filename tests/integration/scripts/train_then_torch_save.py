"""Train under ferry's explicit API, then save the state the script's own way, with
``torch.save``, as scripts do beside ferry's checkpoints. A resumed run must write the
same files as the uninterrupted one: restored tensors own exactly their own memory.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ferry


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--signal-at", type=int, default=-1, help="send SIGUSR1 to self at this step")
    args = p.parse_args()

    torch.manual_seed(0)
    # Many small tensors (biases, norms and their moments): they are read in batches.
    blocks = [nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.ReLU()) for _ in range(8)]
    model = nn.Sequential(*blocks, nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.7)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 16, generator=g), torch.randn(64, 1, generator=g))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    ferry.track(loader=loader, model=model, optimizer=opt, scheduler=sched)

    for _epoch in range(3):
        for x, y in loader:
            if ferry.global_step == args.signal_at:
                os.kill(os.getpid(), signal.SIGUSR1)
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        sched.step()
    os.makedirs(args.out, exist_ok=True)
    torch.save(opt.state_dict(), os.path.join(args.out, "optimizer.pt"))
    torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))
    torch.save(sched.state_dict(), os.path.join(args.out, "scheduler.pt"))
    torch.save(opt.state[model[0][0].bias]["exp_avg"], os.path.join(args.out, "tensor.pt"))


if __name__ == "__main__":
    main()
