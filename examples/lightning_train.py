"""Lightning training made preemptible by ferry's callback.

    FERRY_DIR=ckpts/lightning python examples/lightning_train.py
    # kill -TERM <pid> mid-epoch: ferry checkpoints at the end of the batch and exits 85;
    # run the same command again and it resumes exactly (data position included).

On SLURM, ferry requeues (`ferry run`), so Lightning's auto-requeue is turned off.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.environments import SLURMEnvironment
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ferry.integrations.lightning import FerryCallback


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    pl.seed_everything(0)
    x = torch.randn(4096, 20, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=64, shuffle=True)
    trainer = pl.Trainer(
        max_epochs=20,
        accelerator="cpu",
        callbacks=[FerryCallback()],
        plugins=[SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else [],
        enable_checkpointing=False,  # ferry checkpoints
        logger=False,
    )
    trainer.fit(Regressor(), loader)


if __name__ == "__main__":
    main()
