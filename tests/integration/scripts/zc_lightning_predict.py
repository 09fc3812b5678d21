"""An unmodified Lightning script whose loaders are built in a DataModule's hooks, where
Lightning wraps ``DataLoader.__init__`` and reads its signature to re-create loaders (for
``predict`` and for a DistributedSampler under DDP); it never imports ferry."""

from __future__ import annotations

import sys
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Data(pl.LightningDataModule):
    def setup(self, stage: str) -> None:
        self.x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
        self.y = self.x.sum(1, keepdim=True)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(self.x, self.y), batch_size=8, shuffle=True)

    def predict_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(self.x, self.y), batch_size=8)


def main() -> None:
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model, data = Model(), Data()
    trainer.fit(model, data)
    out = torch.cat(trainer.predict(model, data))  # type: ignore[arg-type]
    print("predicted", out.numel(), out.sum().item().hex())
    sys.stdout.flush()


if __name__ == "__main__":
    main()
