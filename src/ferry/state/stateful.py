"""The one protocol all state flows through."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict`` and ``load_state_dict``: modules, optimizers, LR
    schedulers, grad scalers, and your own objects."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...
