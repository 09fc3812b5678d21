"""Storage backends, chosen by URL scheme through a registry, and their commit strategies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ferry.storage.atomic import STRATEGIES, MarkerCommit, RenameCommit
from ferry.storage.base import CommitStrategy, Reader, Storage, Writer


def _local(url: str, **options: Any) -> Storage:
    from ferry.storage.local import LocalStorage

    return LocalStorage(url)


def _fsspec(url: str, **options: Any) -> Storage:
    from ferry.storage.fsspec_backend import FsspecStorage

    return FsspecStorage(url, **options)


BACKENDS: dict[str, Callable[..., Storage]] = {"": _local, "file": _local}
"""Scheme -> factory. Schemes not listed go to fsspec."""


def scheme(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else ""


def open_storage(url: str, **options: Any) -> Storage:
    """The storage for a checkpoint root URL or local path."""
    factory: Callable[..., Storage] = BACKENDS.get(scheme(url), _fsspec)
    return factory(url, **options)


def strategy_for(storage: Storage) -> CommitStrategy:
    """``rename`` where the backend renames atomically, otherwise a commit ``marker``."""
    return STRATEGIES["rename" if storage.atomic_rename else "marker"]


__all__ = [
    "BACKENDS",
    "CommitStrategy",
    "MarkerCommit",
    "Reader",
    "RenameCommit",
    "Storage",
    "Writer",
    "open_storage",
    "scheme",
    "strategy_for",
]
