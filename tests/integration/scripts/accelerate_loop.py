"""A training loop written with accelerate's own API, as its examples are (it never imports
ferry): ``Accelerator(gradient_accumulation_steps=2)``, ``prepare`` (the loader becomes
accelerate's ``DataLoaderShard``, whose ``__iter__`` is a generator holding one batch ahead),
``accumulate``, ``backward``, a per-step LR schedule with warmup, evaluation each epoch with
``gather_for_metrics``, a metrics file, ``save_state`` at the end. Each trained batch prints
its epoch, ``enumerate`` index, optimizer step count and loss (hex).

``ACC_STOP_AT`` (tests only, comma-separated): after the N-th trained batch (counted from 1
over the run), the job sends itself SIGTERM, a real signal at an exact point; read from the
environment each time (a module global would be restored from the checkpoint)."""

from __future__ import annotations

import hashlib
import json
import os
import signal

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    accelerator = Accelerator(gradient_accumulation_steps=2, cpu=True)
    set_seed(3)
    x = torch.randn(64, 8)
    y = (x[:, :3].sum(1) > 0).long()
    train_dl = DataLoader(TensorDataset(x[:48], y[:48]), batch_size=4, shuffle=True)
    eval_dl = DataLoader(TensorDataset(x[48:], y[48:]), batch_size=8)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))
    model, optimizer, train_dl, eval_dl, scheduler = accelerator.prepare(
        model, optimizer, train_dl, eval_dl, scheduler
    )
    trained = step = 0
    with open("metrics.jsonl", "w") as log:
        for epoch in range(2):
            model.train()
            for batch_idx, (xb, yb) in enumerate(train_dl):
                with accelerator.accumulate(model):
                    loss = nn.functional.cross_entropy(model(xb), yb)
                    accelerator.backward(loss)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
                step += accelerator.sync_gradients
                trained += 1
                accelerator.print(f"epoch {epoch} batch {batch_idx} step {step} loss {loss.item().hex()}")
                if str(trained) in os.environ.get("ACC_STOP_AT", "").split(","):
                    os.kill(os.getpid(), signal.SIGTERM)
            model.eval()
            correct = 0
            for xb, yb in eval_dl:
                with torch.no_grad():
                    pred, ref = accelerator.gather_for_metrics((model(xb).argmax(-1), yb))
                correct += int((pred == ref).sum())
            log.write(json.dumps({"epoch": epoch, "step": step, "correct": correct}) + "\n")
    accelerator.save_state("final_state")
    weights = hashlib.sha256()
    for _, value in sorted(accelerator.unwrap_model(model).state_dict().items()):
        weights.update(value.numpy().tobytes())
    accelerator.print(f"done: step {step} weights {weights.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
