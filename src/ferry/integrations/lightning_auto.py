"""Zero-code support for Lightning (``lightning.pytorch`` or ``pytorch_lightning``): every
``Trainer.fit`` of a script run under ``ferry run`` is driven as ``FerryCallback`` drives
one (``lightning_hooks``), with no change to the script.

Armed by zero-code mode once Lightning is imported. Why import-time hooks and not Lightning's
entry point for external callbacks (``lightning.pytorch.callbacks_factory``): a callback
cannot reach the points ferry needs (the end of a batch after Lightning logged it, the
restore before the loops run, the signal handlers Lightning installs), so hooks are needed
either way; the entry point would also be loaded by every Lightning process of the
environment, ferry or not, and Lightning logs each callback it adds that way (an extra line
that the plain run does not print).
"""

from __future__ import annotations

import sys
from typing import Any

from ferry.integrations import lightning_hooks

_PACKAGES = ("lightning.pytorch", "pytorch_lightning")


def _session(trainer: Any) -> Any:
    from ferry.session import api

    return api.current(create=True)


class LightningSupport:
    name: str = "Lightning"
    modules: tuple[str, ...] = _PACKAGES
    state_name: str = lightning_hooks.NAME

    def arm(self) -> None:
        for package in _PACKAGES:
            if package in sys.modules:
                lightning_hooks.install(package)
        lightning_hooks.drive_when(_session)


SUPPORT = LightningSupport()
