"""An unmodified loop whose torch arrives in one of the ways real scripts import it: after
`datasets` (which asks `importlib.util.find_spec("torch")` while it is imported), after that
look-up alone, through `importlib.import_module`, or lazily inside `main()` (it never imports
ferry)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import time


def _torch(order: str):
    if order == "datasets":
        import datasets  # noqa: F401  (it asks importlib.util.find_spec("torch") while importing)
        import torch

        return torch
    if order == "find-spec":
        assert importlib.util.find_spec("torch") is not None
        import torch

        return torch
    if order == "import-module":
        return importlib.import_module("torch")
    if order == "lazy":
        import torch

        return torch
    raise SystemExit(f"unknown order {order}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--order", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--sleep", type=float, default=0.0)
    args = p.parse_args()
    torch = _torch(args.order)
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x = torch.randn(96, 5)
    y = x @ torch.randn(5, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "log.txt"), "a")  # noqa: SIM115
    step = 0
    for epoch in range(args.steps // len(loader) + 1):
        for xb, yb in loader:
            if step >= args.steps:
                break
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            log.write(f"{epoch} {step} {loss.item().hex()}\n")
            log.flush()
            time.sleep(args.sleep)
    with open(os.path.join(args.out, "params.txt"), "w") as f:
        for name, t in model.state_dict().items():
            f.write(f"{name} {t.numpy().tobytes().hex()}\n")


if __name__ == "__main__":
    main()
