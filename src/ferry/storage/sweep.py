"""Removing retired checkpoints off the caller's thread.

A synchronous ``ferry.save`` with ``keep_last`` retires older checkpoints after its commit.
Taking one back is one atomic step (a rename to a hidden name, or the removal of its commit
marker); deleting its bytes is the slow part (an unlink of gigabytes on ext4, thousands of
requests on an object store), and the caller need not wait for it. The deletion runs on
one background thread; the next commit transaction waits for it before it writes
(``Transaction.begin``), so a new checkpoint's bytes never compete for space with bytes
already retired. The thread is joined when the interpreter exits; a process killed first
leaves a hidden folder, which the next retention removes like any dead save's.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from ferry.storage.base import Storage
from ferry.storage.pools import submit

log = logging.getLogger("ferry")

_pool = ThreadPoolExecutor(1, thread_name_prefix="ferry-sweep")
_pending: list[Future[None]] = []
_lock = threading.Lock()


def _remove(storage: Storage, rel: str) -> None:
    try:
        storage.remove(rel)
    except Exception as exc:  # retired already: the next retention removes it
        log.warning("ferry: a retired checkpoint %s was not removed: %s", storage.child_url(rel), exc)


def later(storage: Storage, rel: str) -> None:
    """Remove ``rel`` (a retired, hidden checkpoint folder) on the background thread."""
    future = submit(_pool, _remove, storage, rel)
    with _lock:
        _pending[:] = [f for f in _pending if not f.done()] + [future]


def swept() -> None:
    """Wait until every removal asked for so far is done."""
    with _lock:
        pending = list(_pending)
    for future in pending:
        future.result()
