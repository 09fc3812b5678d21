"""Keras 3 (torch backend) training made preemptible by ferry's callback.

    KERAS_BACKEND=torch FERRY_DIR=ckpts/keras python examples/keras_train.py
    # kill -TERM <pid> mid-epoch: ferry checkpoints before the next step and exits 85;
    # run the same command again and it resumes exactly where it stopped.

The data may be a torch DataLoader (as here), NumPy arrays or a keras.utils.PyDataset.
Under `ferry run`, the same script without the callback is resumed exactly too.
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
    model.fit(loader, epochs=20, callbacks=[FerryCallback()], verbose=2)


if __name__ == "__main__":
    main()
