"""A script with a SIGTERM handler of its own, installed after ferry's (it never imports
ferry): on SIGTERM it finishes the batch, writes a note and exits 0, as frameworks do
(Lightning ends its fit loop at the batch's end). With `--chain` the handler calls the one
it replaced first, as Lightning's does."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

STOP = False


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--chain", action="store_true")
    args = p.parse_args()
    replaced = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        global STOP
        if args.chain and callable(replaced):
            replaced(signum, frame)
        STOP = True

    signal.signal(signal.SIGTERM, on_term)
    torch.manual_seed(1)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "log.txt"), "a") as log:
        for epoch in range(3):
            for xb, yb in DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True):
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                log.write(f"{epoch} {loss.item().hex()}\n")
                log.flush()
                time.sleep(args.sleep)
                if STOP:
                    log.write("stopped by my own handler\n")
                    sys.exit(0)
    with open(os.path.join(args.out, "params.txt"), "w") as f:
        f.write(f"{model.weight.detach().numpy().tobytes().hex()}\n")


if __name__ == "__main__":
    main()
