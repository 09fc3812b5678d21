"""DataLoader worker pools that must end at exit although their workers ignore SIGTERM.

A framework's support makes the workers of the loaders it draws from ignore the stop
signals (``WorkerInit``: ``ferry run`` signals the whole process group, and the main process
must save before anything ends). At interpreter exit torch leaves a live pool to
multiprocessing, which sends its daemonic workers SIGTERM and waits for them: those wait
for ever, and a finished job never exits. So the pools of the iterators handed to
``watch`` are shut down first, the way torch shuts a pool down when its iterator is dropped
(the workers are told to finish and are joined); an ``atexit`` handler registered after
torch's and multiprocessing's runs before them.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any, TypeVar

T = TypeVar("T")

_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
_registered = False


def watch(iterator: T) -> T:
    """Shut ``iterator``'s worker pool down at exit if it is still alive then; returns it."""
    global _registered
    if callable(getattr(iterator, "_shutdown_workers", None)):
        _LIVE.add(iterator)
        if not _registered:
            _registered = True
            atexit.register(_shut_down)
    return iterator


def _shut_down() -> None:
    for iterator in list(_LIVE):
        iterator._shutdown_workers()
