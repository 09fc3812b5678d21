"""ferry for Keras 3 on the torch backend (``KERAS_BACKEND=torch``).

    model.fit(data, epochs=E, callbacks=[..., FerryCallback()])

Everything ``fit`` keeps is saved and comes back: the epoch and step, the model's, the
optimizer's and the metrics' variables, Keras's seed generators, every callback's state
(EarlyStopping, ReduceLROnPlateau, ModelCheckpoint, CSVLogger and its file, History, ...)
and the data position, whether ``fit`` gets a torch ``DataLoader``, NumPy arrays or a
``keras.utils.PyDataset``. The safe point is the start of each training step, after every
callback has logged the step (or the epoch) before it. Under ``ferry run`` the same happens
without the callback (``keras_auto``); a checkpoint of either resumes under the other.
How: ``_keras_fit`` (the fit), ``_keras_state`` (variables, callbacks), ``_keras_data``.
"""

from __future__ import annotations

from typing import Any

import keras

from ferry import session as _session
from ferry.errors import bug
from ferry.integrations import _keras_fit


class FerryCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Makes ``model.fit`` preemptible and resumes it exactly. See docs/integrations.md."""

    ferry_callback = True
    """Marks ferry's own callback: not part of the fit's state, and zero-code mode steps aside."""

    def __init__(self) -> None:
        super().__init__()
        self.session = _session.current()  # ferry's signal handlers from now on
        if self.session is None:
            raise bug("no ferry session in this process")
        _keras_fit.install()
        self._fit: _keras_fit.KerasFit | None = None

    @property
    def initial_epoch(self) -> int:
        """The epoch the checkpoint was taken in (0 fresh). ``fit`` gets it from the callback
        by itself; passing it as ``fit(initial_epoch=...)`` too does no harm."""
        saved = _keras_fit._saved(self.session)
        return 0 if saved is None else int(saved["epoch"])

    def on_train_begin(self, logs: Any = None) -> None:
        self._fit = _keras_fit.KerasFit(self.model, self.session)
        self._fit.begin()

    def on_train_end(self, logs: Any = None) -> None:
        if self._fit is not None:
            self._fit.end(finished=True)
            self._fit = None
