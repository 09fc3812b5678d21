"""A small, deterministic CUDA training run for the process-checkpoint GPU tests.

It knows nothing of ferry. It prints ``step N`` after every step (so a test can catch it
mid-run), keeps ``--ballast-mb`` of random data on the GPU that it never touches, and
at the end writes JSON: every loss (``float.hex``, so equal means bitwise equal), a
SHA-256 of the final parameters, and a SHA-256 of the ballast before and after.

    python train_child.py OUT.json [--steps 300] [--ballast-mb 256] [--sleep 0.01]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, before torch

import torch
import torch.nn.functional as F


def digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--ballast-mb", type=int, default=256)
    ap.add_argument("--sleep", type=float, default=0.01)
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(1024, 10)
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ballast = torch.randn(args.ballast_mb * 2**18, device=dev, generator=gen)  # float32: 4 bytes each
    ballast_before = digest([ballast])
    print(f"ready {torch.cuda.get_device_name()}", flush=True)

    losses = []
    for step in range(args.steps):
        x = torch.randn(128, 256, device=dev, generator=gen)
        y = torch.randint(0, 10, (128,), device=dev, generator=gen)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()).hex())  # .item() waits for the GPU each step
        print(f"step {step + 1}", flush=True)
        time.sleep(args.sleep)

    result = {
        "losses": losses,
        "params": digest(list(model.parameters())),
        "ballast_before": ballast_before,
        "ballast_after": digest([ballast]),
    }
    with open(args.out + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
