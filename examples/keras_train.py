"""Keras 3 (torch backend) training made preemptible by ferry's callback.

    KERAS_BACKEND=torch FERRY_DIR=ckpts/keras python examples/keras_train.py
    # kill -TERM <pid> mid-epoch: ferry checkpoints at the end of the batch and exits 85;
    # run the same command again and it resumes exactly where it stopped.

Keras gets its data from a torch DataLoader so that ferry can resume the data position.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import torch
from torch.utils.data import DataLoader, TensorDataset

from ferry.integrations.keras import FerryCallback


def main() -> None:
    keras.utils.set_random_seed(0)
    x = torch.randn(4096, 20, generator=torch.Generator().manual_seed(1))
    y = (x.sum(1, keepdim=True) > 0).float()
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
    model = keras.Sequential(
        [keras.Input((20,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss="mse")
    ferry_cb = FerryCallback(model, loader)  # after compile, right before fit
    model.fit(loader, epochs=20, initial_epoch=ferry_cb.initial_epoch, callbacks=[ferry_cb], verbose=2)


if __name__ == "__main__":
    main()
