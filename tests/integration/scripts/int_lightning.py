"""Lightning training with ferry's callback; --signal-at N sends SIGTERM after batch N."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.environments import SLURMEnvironment
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ferry.integrations.lightning import FerryCallback


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class SignalAt(pl.Callback):
    def __init__(self, at: int) -> None:
        self.at, self.seen = at, 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.seen += 1
        if self.seen == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--signal-at", type=int, default=0)
    parser.add_argument("--slurm-auto-requeue", action="store_true", help="Lightning's requeue left on")
    args = parser.parse_args()
    pl.seed_everything(0, verbose=False)
    data = torch.Generator().manual_seed(1)
    x = torch.randn(96, 8, generator=data)
    y = x.sum(1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)  # 12 batches an epoch
    model = Tiny()
    ferry_cb = FerryCallback()
    callbacks = [SignalAt(args.signal_at), ferry_cb] if args.signal_at else [ferry_cb]
    trainer = pl.Trainer(
        max_epochs=4,
        accelerator="cpu",
        devices=1,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        plugins=[SLURMEnvironment(auto_requeue=True)] if args.slurm_auto_requeue else [],
    )
    trainer.fit(model, loader)
    args.out.mkdir(parents=True, exist_ok=True)
    state = [*model.state_dict().values()]
    for group in trainer.optimizers[0].state.values():
        state += [v for v in group.values() if isinstance(v, torch.Tensor)]
    lines = [t.detach().numpy().tobytes().hex() for t in state]
    lines.append(f"global_step={trainer.global_step} epoch={trainer.current_epoch}")
    (args.out / "params.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
