"""The one way ferry rewrites a small JSON file in place: whole or not at all.

Every file another process reads while it is rewritten (a job's ``status.json`` and
``job.json``, control requests and answers, a SLURM job's requeue claim, a suspended
process's record, a CRIU dump's manifest) goes through ``write_json_atomic``:

1. the document goes to a temporary name beside the target, created exclusively
   (``O_CREAT | O_EXCL``) and with ``O_NOFOLLOW``: a symlink planted at that name is never
   written through; a leftover of a dead process of the same pid is removed (the link
   itself, never what it points to) and the name created anew;
2. with ``durable``, the file is fsynced before the rename and its folder after it, so that
   the new content, not an empty file, is what a power cut leaves;
3. ``os.replace`` puts it in place: a reader sees the old file or the new one, never a half
   of either, and a symlink planted at the target is replaced, not followed.

A crash before the rename leaves the old file as it was (and a temporary file beside it).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _create(tmp: str, mode: int) -> int:
    try:
        return os.open(tmp, _CREATE, mode)
    except FileExistsError:  # a leftover of a dead process with our pid, or planted: unlinked
        os.unlink(tmp)
    return os.open(tmp, _CREATE, mode)  # raises when something raced in again


def _fsync_dir(path: str) -> None:
    """Make the entries of folder ``path`` (a rename into it) durable. Checkpoints have
    ``storage.local.fsync_dir``; this one spares the job files and the SLURM adapter the
    import of ``ferry.storage`` (fsspec: a tenth of a second)."""
    fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: str, doc: object, *, durable: bool = False, mode: int = 0o600) -> None:
    """Replace ``path`` with ``doc`` as JSON (indented, keys sorted, other values as their
    ``str``), atomically; ``durable``: fsync the file and its folder too."""
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    fd = _create(tmp, mode)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True, default=str)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        _fsync_dir(os.path.dirname(path))


__all__ = ["write_json_atomic"]
