"""Storage backends, chosen by URL scheme through a registry; their commit strategies, and
the commit transaction every checkpoint writer goes through."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ferry.storage.atomic import MarkerCommit, RenameCommit, strategy_for
from ferry.storage.base import AtomicRename, CommitStrategy, LocalFiles, Reader, Storage, Writer
from ferry.storage.transaction import FileRecord, Transaction


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


__all__ = [
    "BACKENDS",
    "AtomicRename",
    "CommitStrategy",
    "FileRecord",
    "LocalFiles",
    "MarkerCommit",
    "Reader",
    "RenameCommit",
    "Storage",
    "Transaction",
    "Writer",
    "open_storage",
    "scheme",
    "strategy_for",
]
