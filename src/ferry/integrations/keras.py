"""ferry for Keras 3 (any backend whose variables convert to NumPy; tested with ``torch``).

    callback = FerryCallback(model, loader)        # after the model is compiled
    model.fit(loader, epochs=E, initial_epoch=callback.initial_epoch, callbacks=[callback])

The end of each training batch is a safe point. The model's and optimizer's variables are
saved through a small Stateful (Keras variables are not torch state); the data position is
that of a torch ``DataLoader`` given to ``fit``. ``initial_epoch`` is the epoch to resume in.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from ferry import session as _session
from ferry.errors import bug
from ferry.integrations._position import LoaderPosition


class KerasState:
    """The variables of a Keras model and of its optimizer, by path, as NumPy arrays."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def _variables(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for prefix, variables in (
            ("model", self.model.variables),
            ("optimizer", self.model.optimizer.variables),
        ):
            for i, var in enumerate(variables):
                found[f"{prefix}/{i}/{var.path}"] = var
        return found

    def state_dict(self) -> dict[str, Any]:
        return {name: np.array(keras.ops.convert_to_numpy(v)) for name, v in self._variables().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        variables = self._variables()
        missing = sorted(set(variables) ^ set(state))
        if missing:
            raise ValueError(f"the checkpoint's Keras variables differ from the model's: {missing[:5]}")
        for name, var in variables.items():
            var.assign(state[name])


class FerryCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Makes ``model.fit`` preemptible and resumes it exactly. See docs/integrations.md."""

    def __init__(self, model: Any, loader: Any) -> None:
        super().__init__()
        self.session = _session.current()
        if self.session is None:
            raise bug("no ferry session in this process")
        self.position = LoaderPosition()
        self.position.attach(loader)
        self.state = KerasState(model)
        saved = self.session.saved_state("keras_progress")
        self.progress: dict[str, int] = {"epoch": 0 if saved is None else int(saved["epoch"])}

    @property
    def initial_epoch(self) -> int:
        """Pass to ``fit(initial_epoch=...)``: the epoch the checkpoint was taken in (0 fresh)."""
        return int(self.progress["epoch"])

    def on_train_begin(self, logs: Any = None) -> None:
        # Restored here, not earlier: fit() draws random numbers while it sets up, before this.
        model = self.state.model
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        if self.session is None:
            raise bug("no ferry session in this process")
        self.session.track(keras=self.state, keras_progress=self.progress, keras_data=self.position)
        self.session.restore()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.progress["epoch"] = epoch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.position.batch_done():  # the epoch is complete: a resume starts the next one
            self.progress["epoch"] += 1
        if self.session is None:
            raise bug("no ferry session in this process")
        self.session.step()  # a safe point: checkpoints when one is due, exits 85 after a stop
