"""Keras 3 (torch backend) training with ferry's callback; --signal-at N sends SIGTERM after batch N."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from ferry.integrations.keras import FerryCallback


class SignalAt(keras.callbacks.Callback):  # type: ignore[misc]
    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.seen = at, 0

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        self.seen += 1
        if self.seen == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--signal-at", type=int, default=0)
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    data = torch.Generator().manual_seed(1)
    x = torch.randn(96, 8, generator=data)
    y = (x.sum(1, keepdim=True) > 0).float()
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)  # 12 batches an epoch
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.AdamW(1e-2), loss="mse")
    ferry_cb = FerryCallback()
    callbacks = [SignalAt(args.signal_at), ferry_cb] if args.signal_at else [ferry_cb]
    model.fit(loader, epochs=4, callbacks=callbacks, verbose=0)
    args.out.mkdir(parents=True, exist_ok=True)
    state = [np.asarray(keras.ops.convert_to_numpy(v)) for v in model.variables + model.optimizer.variables]
    (args.out / "params.txt").write_text("\n".join(a.tobytes().hex() for a in state) + "\n")


if __name__ == "__main__":
    main()
