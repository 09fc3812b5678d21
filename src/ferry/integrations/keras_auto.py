"""Zero-code support for Keras 3 on the torch backend: ``ferry run -- python train.py`` makes
``model.fit`` preemptible and resumes it exactly, with no change to the script.

Armed once ``keras`` is imported (``autotrack/frameworks.py``), and only on the torch
backend: it hooks ``fit`` of Keras's torch trainer (keeping its name, signature and
``__wrapped__``) so that each call runs as one ``KerasFit`` (``_keras_fit``: the same
machinery as the explicit ``FerryCallback``, under the same state name, so that a
checkpoint of either mode resumes under the other). The fit's callback list is left as
the script made it. A fit given ferry's explicit callback is left to that callback.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from ferry.integrations._keras_fit import STATE_NAME


class KerasSupport:
    name: str = "Keras"
    modules: tuple[str, ...] = ("keras",)
    state_name: str = STATE_NAME

    def __init__(self) -> None:
        self.armed = False

    def arm(self) -> None:
        if self.armed:
            return
        self.armed = True
        import keras

        if keras.config.backend() != "torch":
            return  # ferry resumes torch training: the other backends' fit is left alone
        from keras.src.backend.torch.trainer import TorchTrainer

        from ferry.integrations import _keras_fit

        _keras_fit.install()
        original = vars(TorchTrainer)["fit"]
        if not getattr(original, "_ferry_hook", False):
            hooked = _fit_hook(original)
            hooked._ferry_hook = True  # type: ignore[attr-defined]
            TorchTrainer.fit = hooked


def _fit_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        from ferry import session
        from ferry.integrations import _keras_fit

        callbacks = signature.bind(self, *args, **kwargs).arguments.get("callbacks")
        listed = getattr(callbacks, "callbacks", callbacks) or []
        if _keras_fit.active() is not None or any(getattr(cb, "ferry_callback", False) for cb in listed):
            return original(self, *args, **kwargs)  # a fit inside a fit, or the explicit callback's
        run = _keras_fit.KerasFit(self, session.current())
        run.begin()
        finished = False
        try:
            result = original(self, *args, **kwargs)
            finished = True
            return result
        finally:
            run.end(finished)

    return fit


SUPPORT = KerasSupport()
