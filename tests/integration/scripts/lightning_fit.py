"""A public-style Lightning script that never imports ferry (unless ``--callback``): a
LightningModule with dropout, AdamW and a per-step StepLR, ``on_save_checkpoint`` /
``on_load_checkpoint`` hooks, a DataModule, validation twice an epoch, ModelCheckpoint
(top-2 by ``val_loss`` and ``last.ckpt``), EarlyStopping, a CSVLogger, then ``predict``.

Each trained batch prints one line (its epoch, index, global step and loss in hex), each
validation one line; at the end the final weights, the optimizer state and the Lightning
checkpoints' contents are printed as digests. ``--strategy ddp --devices 2``: Lightning
runs the script again as rank 1 (gloo on CPU). ``--sleep``/``--val-sleep``: seconds per
batch, to give a stop time to land (they change no output).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def say(rank: int, line: str) -> None:
    """Rank 0 prints; other ranks write to ``rank<N>.log`` (two processes printing to one pipe
    can interleave inside a line)."""
    if rank == 0:
        print(line, flush=True)
    else:
        with open(f"rank{rank}.log", "a") as out:
            out.write(line + "\n")


def digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class Net(pl.LightningModule):
    def __init__(self, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
        self.seen = 0  # plain Python state, kept through on_save_checkpoint/on_load_checkpoint

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        self.seen += len(x)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs["loss"].item()
        say(self.global_rank, f"rank {self.global_rank} epoch {self.current_epoch} batch {batch_idx} "
            f"step {self.global_step} loss {loss.hex()} seen {self.seen}")  # fmt: skip

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def on_validation_epoch_start(self) -> None:
        if not self.trainer.sanity_checking:
            say(self.global_rank, f"rank {self.global_rank} validating at step {self.global_step}")

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch[0])

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["seen"] = self.seen

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.seen = checkpoint["seen"]


class Data(pl.LightningDataModule):
    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(96, 8, generator=g)
        self.y = self.x.sum(1, keepdim=True) + 0.1 * torch.randn(96, 1, generator=g)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(self.x[:64], self.y[:64]), batch_size=8, shuffle=True)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(self.x[64:], self.y[64:]), batch_size=16)

    def predict_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(self.x[64:], self.y[64:]), batch_size=16)


class Pace(pl.Callback):
    """Slows training down (the output does not change): a stop then lands where asked."""

    def __init__(self, train: float, val: float) -> None:
        self.train, self.val = train, val

    def on_train_batch_end(self, *args: Any) -> None:
        time.sleep(self.train)

    def on_validation_batch_end(self, *args: Any) -> None:
        time.sleep(self.val)


def canonical(value: Any) -> Any:
    """A Lightning checkpoint's content, comparable between two working folders: tensors by
    digest, the folder's own path made relative."""
    if isinstance(value, torch.Tensor):
        return digest([value])
    if isinstance(value, dict):
        return sorted((canonical(k), canonical(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, str):
        return value.replace(os.getcwd(), ".")
    return repr(value)


def ckpt_digests(folder: Path) -> list[str]:
    """Each Lightning checkpoint: its epoch, step and module state, and a digest of all of it
    (weights, optimizer, schedulers, loops, callbacks)."""
    lines = []
    for path in sorted(folder.glob("*.ckpt")):
        ck = torch.load(path, weights_only=False)
        whole = hashlib.sha256(repr(canonical(ck)).encode()).hexdigest()[:16]
        head = f"{path.name} epoch={ck['epoch']} step={ck['global_step']} seen={ck['seen']}"
        lines.append(f"{head} all={whole}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--val-sleep", type=float, default=0.0)
    parser.add_argument("--callback", action="store_true", help="with ferry's explicit FerryCallback")
    args = parser.parse_args()
    pl.seed_everything(0, verbose=False)
    callbacks: list[Any] = [
        ModelCheckpoint(dirpath="ckpt", monitor="val_loss", save_top_k=2, save_last=True),
        EarlyStopping(monitor="val_loss", patience=100),
        Pace(args.sleep, args.val_sleep),
    ]
    if args.callback:
        from ferry.integrations.lightning import FerryCallback

        callbacks.append(FerryCallback())
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=args.devices,
        strategy=args.strategy,
        callbacks=callbacks,
        logger=CSVLogger(".", name="logs"),
        log_every_n_steps=1,
        val_check_interval=0.5,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    model, data = Net(), Data()
    trainer.fit(model, data)
    opt = digest([v for st in trainer.optimizers[0].state.values() for v in st.values()])
    weights = digest(list(model.state_dict().values()))
    say(trainer.global_rank, f"rank {trainer.global_rank} fit done: step {trainer.global_step} "
        f"epoch {trainer.current_epoch} weights {weights} optimizer {opt}")  # fmt: skip
    out = trainer.predict(model, data)
    if trainer.is_global_zero:
        print("predicted", digest(list(out)))  # type: ignore[arg-type]
        for line in ckpt_digests(Path("ckpt")):
            print(line)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
