"""Which framework loops zero-code mode supports, armed when the framework is imported.

A registry from the framework's import name to its support object
(``ferry.integrations.framework.FrameworkSupport``); each support is imported only once its
framework is, so that ``import ferry`` and a script without the framework import none of
them."""

from __future__ import annotations

import os
from collections.abc import Callable

from ferry.integrations.framework import FrameworkSupport

KNOWN: dict[str, Callable[[], FrameworkSupport]] = {}
"""Import name that arms a framework's support -> a function returning that support.
Filled by the framework modules' entries below, one line per framework."""


_ARMED: set[str] = set()
"""The top-level packages of the frameworks whose support is armed in this process."""


def covers(filename: str) -> bool:
    """Is ``filename`` in a framework whose armed support captures its loop?"""
    parts = os.path.abspath(filename).split(os.sep)
    return any(package in parts for package in _ARMED)


def arm_when_imported(after_import: Callable[[str, Callable[[], None]], None]) -> None:
    """Arm each known framework's support once its module has been imported;
    ``after_import(module, callback)`` runs the callback at once when it already is."""
    armed: set[str] = set()
    for module, support in KNOWN.items():

        def arm(support: Callable[[], FrameworkSupport] = support) -> None:
            chosen = support()
            if chosen.state_name not in armed:
                armed.add(chosen.state_name)
                chosen.arm()
                _ARMED.update(m.split(".")[0] for m in chosen.modules)

        after_import(module, arm)


def _lightning() -> FrameworkSupport:
    from ferry.integrations.lightning_auto import SUPPORT

    return SUPPORT


KNOWN["lightning.pytorch"] = KNOWN["pytorch_lightning"] = _lightning


def _transformers() -> FrameworkSupport:
    from ferry.integrations.transformers_auto import SUPPORT

    return SUPPORT


KNOWN["transformers.trainer"] = _transformers


def _keras() -> FrameworkSupport:
    from ferry.integrations.keras_auto import SUPPORT

    return SUPPORT


KNOWN["keras"] = _keras
