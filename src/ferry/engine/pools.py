"""The engine's name for ``ferry.storage.pools`` (the storage layer's writer uses it too)."""

from __future__ import annotations

from ferry.storage.pools import submit

__all__ = ["submit"]
