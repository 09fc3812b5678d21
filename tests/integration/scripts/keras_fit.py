"""Keras 3 ``model.fit`` as its users write it (torch backend, no ferry code): a small MLP with
dropout, AdamW, validation data, and the usual callbacks (ModelCheckpoint per epoch, per 7
batches and best-only, CSVLogger, EarlyStopping, ReduceLROnPlateau), ``verbose=2``.

``--data`` picks what ``fit`` gets: a torch ``DataLoader`` (shuffled; ``--workers N``:
persistent workers), NumPy arrays (``fit`` shuffles them itself) or a ``keras.utils.PyDataset``
(shuffled by ``fit`` too). At the end it prints the History and writes ``final.txt``: a
digest of every model variable and every optimizer variable and the number of optimizer
steps. ``--ferry-callback`` adds ferry's explicit callback (the one line of ferry an
explicit-mode script has).

``KERAS_STOP_AT`` (tests only): ``train:N`` or ``val:N``, comma-separated, sends SIGTERM to
this process after its N-th training (or validation) batch: a real signal at an exact point.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset


class Batches(keras.utils.PyDataset):  # type: ignore[misc]
    def __init__(self, x: np.ndarray, y: np.ndarray, size: int) -> None:
        super().__init__()
        self.x, self.y, self.size = x, y, size

    def __len__(self) -> int:
        return -(-len(self.x) // self.size)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        part = slice(i * self.size, (i + 1) * self.size)
        return self.x[part], self.y[part]


class StopAt(keras.callbacks.Callback):  # type: ignore[misc]
    """Sends SIGTERM to this process after the given training / validation batches."""

    def __init__(self, spec: str) -> None:
        super().__init__()
        self.at = [item.split(":") for item in spec.split(",") if item]
        self.counts = {"train": 0, "val": 0}

    def _count(self, kind: str) -> None:
        self.counts[kind] += 1
        if [kind, str(self.counts[kind])] in self.at:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        self._count("train")

    def on_test_batch_end(self, batch: int, logs: object = None) -> None:
        self._count("val")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", choices=["loader", "array", "pydataset"], default="loader")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--ferry-callback", action="store_true", help="ferry's explicit callback")
    parser.add_argument("--workers", type=int, default=0, help="persistent DataLoader workers")
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(96, 8)).astype("float32")
    y = (x[:, :3].sum(1, keepdims=True) > 0).astype("float32")
    vx = rng.normal(size=(40, 8)).astype("float32")
    vy = (vx[:, :3].sum(1, keepdims=True) > 0).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(optimizer=keras.optimizers.AdamW(2e-2), loss="binary_crossentropy", metrics=["accuracy"])
    os.makedirs("ckpt", exist_ok=True)
    callbacks = [
        keras.callbacks.ModelCheckpoint("ckpt/epoch{epoch:02d}.weights.h5", save_weights_only=True),
        keras.callbacks.ModelCheckpoint(
            "ckpt/b{epoch:02d}-{batch:02d}.weights.h5", save_weights_only=True, save_freq=7
        ),
        keras.callbacks.ModelCheckpoint(
            "ckpt/best.weights.h5", monitor="val_loss", save_best_only=True, save_weights_only=True, verbose=1
        ),
        keras.callbacks.CSVLogger("log.csv"),
        keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=0.03, patience=1, verbose=1),
        keras.callbacks.ReduceLROnPlateau(
            monitor="val_loss", factor=0.5, patience=0, min_delta=0.03, verbose=1
        ),
        StopAt(os.environ.get("KERAS_STOP_AT", "")),
    ]
    if args.ferry_callback:
        from ferry.integrations.keras import FerryCallback

        callbacks.append(FerryCallback())
    fit_args: dict[str, object] = {"epochs": args.epochs, "callbacks": callbacks, "verbose": 2}
    if args.data == "loader":
        train = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
        loader = DataLoader(
            train, batch_size=8, shuffle=True, num_workers=args.workers, persistent_workers=args.workers > 0
        )
        val = DataLoader(TensorDataset(torch.from_numpy(vx), torch.from_numpy(vy)), batch_size=8)
        history = model.fit(loader, validation_data=val, **fit_args)
    elif args.data == "array":
        history = model.fit(x, y, batch_size=8, validation_data=(vx, vy), **fit_args)
    else:
        history = model.fit(Batches(x, y, 8), validation_data=Batches(vx, vy, 8), **fit_args)
    print("history:", {k: [round(v, 6) for v in vs] for k, vs in history.history.items()})
    print("epochs:", history.epoch)
    with open("final.txt", "w") as out:
        for v in model.variables + model.optimizer.variables:
            data = np.ascontiguousarray(keras.ops.convert_to_numpy(v))
            out.write(f"{v.path} {hashlib.sha256(data.tobytes()).hexdigest()[:16]}\n")
        out.write(f"steps {int(model.optimizer.iterations)}\n")


if __name__ == "__main__":
    main()
