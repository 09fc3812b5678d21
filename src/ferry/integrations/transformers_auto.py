"""Zero-code support for the Hugging Face ``Trainer``: an unmodified script under ``ferry run``
resumes inside the Trainer's own loop exactly (docs/zero-code.md, "Frameworks").

Armed once ``transformers.trainer`` is imported, it hooks two public methods of ``Trainer``
(each hook keeps the method's name, signature and ``__wrapped__``):

- ``__init__``: adds ferry's ``FerryCallback`` (``integrations/transformers.py``) first in
  the Trainer's callbacks, unless the script added one itself (explicit mode), and keeps
  SIGTERM ferry's when ``enable_jit_checkpoint`` took it (``keep_stop_handler``);
- ``train``: does what a script of the explicit mode does, ``train(resume_from_checkpoint=
  callback.resume_from(trainer))``: on resume, the folder the Trainer's own resume reads
  replaces the script's ``resume_from_checkpoint`` (a Trainer checkpoint that a
  ``run_clm.py``-style script found in its output folder is older than ferry's).

Everything else is the explicit callback's, under the same names, so a checkpoint of either
mode resumes under the other.
"""

from __future__ import annotations

import functools
import inspect
import logging
import signal
from collections.abc import Callable
from typing import Any

from ferry.integrations._hf_progress import STATE_NAME

log = logging.getLogger("ferry")


class TransformersSupport:
    """The ``FrameworkSupport`` of the Hugging Face Trainer (``integrations/framework.py``)."""

    name: str = "Hugging Face Trainer"
    modules: tuple[str, ...] = ("transformers.trainer",)
    state_name: str = STATE_NAME

    def __init__(self) -> None:
        self.armed = False

    def arm(self) -> None:
        if self.armed:
            return
        from transformers.trainer import Trainer

        self.armed = True
        Trainer.__init__ = _hooked_init(Trainer.__init__)  # type: ignore[method-assign]
        Trainer.train = _hooked_train(Trainer.train)  # type: ignore[method-assign]


SUPPORT = TransformersSupport()


def _hooked_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        from ferry.integrations.transformers import FerryCallback, keep_stop_handler

        ours = signal.getsignal(signal.SIGTERM)  # ferry's, armed at start-up
        original(self, *args, **kwargs)
        if _explicit(self) is None and _added(self) is None:
            callback = FerryCallback()
            callback.zero_code = True
            self.callback_handler.callbacks.insert(0, callback)
        keep_stop_handler(self.args, ours)

    return __init__


def _hooked_train(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def train(self: Any, *args: Any, **kwargs: Any) -> Any:
        callback = _added(self)
        if callback is None:
            return original(self, *args, **kwargs)
        if _explicit(self) is not None:  # the script added its own after __init__: it leads
            self.callback_handler.callbacks.remove(callback)
            return original(self, *args, **kwargs)
        folder = callback.resume_from(self)
        if folder is None:
            return original(self, *args, **kwargs)
        call = signature.bind(self, *args, **kwargs)
        given = call.arguments.get("resume_from_checkpoint")
        if given not in (None, False):
            log.warning(
                "ferry: resuming from ferry's checkpoint at step %d, not from %s",
                callback.session.global_step,
                given,
            )
        call.arguments["resume_from_checkpoint"] = folder
        return original(*call.args, **call.kwargs)

    return train


def _added(trainer: Any) -> Any:
    """The callback zero-code mode added to ``trainer``, if any."""
    return next((c for c in trainer.callback_handler.callbacks if getattr(c, "zero_code", False)), None)


def _explicit(trainer: Any) -> Any:
    """A ``FerryCallback`` the script added itself, if any."""
    from ferry.integrations.transformers import FerryCallback

    return next(
        (
            c
            for c in trainer.callback_handler.callbacks
            if isinstance(c, FerryCallback) and not getattr(c, "zero_code", False)
        ),
        None,
    )
