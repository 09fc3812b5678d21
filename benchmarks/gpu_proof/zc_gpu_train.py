"""A GPU training loop that knows nothing of ferry, for gpu_proof.sh's zero-code part: mixed
precision (float16 autocast, ``GradScaler``), ``torch.compile``, dropout (the CUDA random
stream), a shuffling DataLoader, AdamW and a OneCycle schedule whose ``total_steps`` is the
step budget (zero-code mode restores the scheduler; see docs/zero-code.md), deterministic
algorithms. Each step appends its loss (``float.hex``) and the scaler's scale to
``OUT/log.txt``; the end writes a SHA-256 of each parameter and optimizer tensor to
``OUT/params.txt``.

    python zc_gpu_train.py --out OUT [--steps 200] [--sleep 0] [--device cuda] [--backend inductor]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, before torch

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(
        t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    ).hexdigest()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--backend", default="inductor")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    device = torch.device(args.device)
    x = torch.randn(4096, 256)
    y = torch.tanh(x @ torch.randn(256, 10) / 16)
    loader = DataLoader(TensorDataset(x, y), batch_size=128, shuffle=True, drop_last=True)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Dropout(0.1), nn.Linear(1024, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model = torch.compile(model, backend=args.backend)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=args.steps)
    half = torch.float16 if device.type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type)
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "log.txt"), "a")  # noqa: SIM115
    it = iter(loader)
    while sched.last_epoch < args.steps:
        try:
            xb, yb = next(it)
        except StopIteration:
            it = iter(loader)
            xb, yb = next(it)
        xb, yb = xb.to(device), yb.to(device)
        with torch.autocast(device.type, dtype=half):
            loss = F.mse_loss(model(xb).float(), yb)  # deterministic on CUDA, as every op here
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
        log.write(f"{sched.last_epoch} {loss.item().hex()} {scaler.get_scale()}\n")
        log.flush()
        if args.sleep:
            time.sleep(args.sleep)
    with open(os.path.join(args.out, "params.txt"), "w") as f:
        for name, t in model.state_dict().items():
            f.write(f"{name} {digest(t)}\n")
        for i, state in opt.state_dict()["state"].items():
            for key, value in state.items():
                f.write(f"opt.{i}.{key} {digest(value) if isinstance(value, torch.Tensor) else value}\n")
        f.write(f"scale {scaler.get_scale()}\n")


if __name__ == "__main__":
    main()
