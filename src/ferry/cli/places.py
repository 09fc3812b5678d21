"""Where a command reads and writes, checked before anything runs: a URL's scheme (a storage
backend that exists, and is installed) and a local folder this user can create and write.
A typo in a path or a scheme then costs one line and exit 2, never a traceback, and never a
job stopped for an export that cannot be written."""

from __future__ import annotations

import os
import tempfile

from ferry.cli.params import Checked
from ferry.errors import ConfigError
from ferry.storage import BACKENDS, scheme
from ferry.storage.extras import backend_problem


def check_url(url: str) -> str:
    """A checkpoint, root or bundle to read or write: ConfigError for a scheme no storage
    backend knows, or one whose package is missing (with its install line), in the words of
    ``ferry run --dir`` (both say ``storage.extras.backend_problem``; ``check_root`` itself is
    not imported here: the supervisor's import would make these commands slow to start).
    ``memory://`` passes: read from a fresh process it holds nothing, and the command says so
    ("does not exist")."""
    proto = scheme(url)
    if not url or "\0" in url:
        raise ConfigError(f"{url!r} is not a path or URL: name a checkpoint, a root or a bundle")
    if proto in BACKENDS or proto == "memory":
        return url
    problem = backend_problem(url, proto)
    if problem is not None:
        raise ConfigError(problem)
    return url


URL = Checked("URL", check_url)
"""A URL argument (inspect, verify, export-weights, export, resume), checked by ``check_url``."""


def local_path(url: str) -> str | None:
    """The absolute local path of ``url`` (a path or a ``file://`` URL); None for a remote one."""
    if url.startswith("file://"):
        return os.path.abspath(url[len("file://") :])
    return None if "://" in url else os.path.abspath(url)


def check_writable(url: str, what: str, fix: str) -> None:
    """ConfigError when the local folder ``url`` (created on demand, as ferry creates it)
    cannot be created or written by this user: ``what`` names it in the message and ``fix``
    says what to give instead. A remote URL passes (its store answers at the first write).

    The nearest folder that exists is probed by making (and removing) a folder in it, which
    also catches what permission bits do not tell root: a read-only mount, ``/proc``."""
    path = local_path(url)
    if path is None:
        return
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        why = "is not a folder" if existing == path else f"cannot be made: {existing} is not a folder"
        raise ConfigError(f"{what} {url} {why}: {fix}")
    try:
        probe = tempfile.mkdtemp(prefix=".ferry-probe-", dir=existing)
    except OSError as exc:
        raise ConfigError(f"cannot write {what} {url} ({exc.strerror} in {existing}): {fix}") from None
    os.rmdir(probe)


def check_output(path: str, what: str, fix: str) -> None:
    """ConfigError when the file ``path`` cannot be written: its folder does not exist (the
    commands that write one file make no folders), is not a folder, or cannot be written
    by this user; or ``path`` is a folder. Checked before the work that produces the file."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"cannot write {what} {path}: there is no folder {folder}; {fix}")
    if os.path.isdir(path):
        raise ConfigError(f"{what} {path} is a folder: {fix}")
    check_writable(folder, f"{path}: its folder", fix)
