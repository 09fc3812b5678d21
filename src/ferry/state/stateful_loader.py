"""Loaders that keep their own position: torchdata's ``StatefulDataLoader`` protocol.

A loader whose class has ``state_dict()`` and ``load_state_dict()`` (duck typing: any
DataLoader subclass that follows StatefulDataLoader's protocol) knows its own position
better than ferry's skipping at the sampler does: its state covers what it yielded, its
sampler's and its workers' state, and stateful datasets. So ferry saves that state as the
loader's position, beside ferry's own epoch and batch count (which still decide which
epoch the resumed script is in, and where the safe points are), and at the saved epoch it
calls ``load_state_dict`` before the loader's ``__iter__`` instead of skipping batches.

StatefulDataLoader overrides ``__iter__`` without calling ``DataLoader.__iter__``, so the
hook that makes each batch a safe point is put on the class that defines ``__iter__``
too (``hook_class``, state/loader.py), the first time such a loader is built or tracked.
Its ``__init__`` does not call ``DataLoader.__init__`` either: zero-code mode hooks
torchdata's class when torchdata is imported (``KNOWN``, autotrack/hooks.py).
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader


def is_stateful(loader: DataLoader[Any]) -> bool:
    return is_stateful_class(type(loader))


def is_stateful_class(cls: type) -> bool:
    return callable(getattr(cls, "state_dict", None)) and callable(getattr(cls, "load_state_dict", None))


def position(loader: DataLoader[Any]) -> dict[str, Any]:
    """``{"loader_state": ...}`` for a stateful loader, else nothing."""
    return {"loader_state": loader.state_dict()} if is_stateful(loader) else {}  # type: ignore[attr-defined]


def load(loader: DataLoader[Any], state: Any) -> None:
    loader.load_state_dict(state)  # type: ignore[attr-defined]


def iter_owner(cls: type) -> type | None:
    """The class below DataLoader that defines ``__iter__`` for ``cls``; None when it is
    DataLoader's own (already hooked)."""
    for klass in cls.__mro__:
        if klass is DataLoader:
            return None
        if "__iter__" in vars(klass):
            return klass
    return None


KNOWN = {"torchdata.stateful_dataloader.stateful_dataloader": "StatefulDataLoader"}
"""Stateful loader classes whose constructor bypasses ``DataLoader.__init__`` (so the
construction hook never sees them): module -> class name, hooked when the module loads."""
