"""Hand the state over in host memory across an in-place restart.

A worker that stops so that `ferry run` can start it again (a ``restart`` request, a
migration to other devices) commits its checkpoint to durable storage as always, then
leaves a second copy in ``handoff_dir``, a tmpfs folder: host memory. The restarted worker
loads that copy when it is at least as new as the newest durable checkpoint, and removes
it. A crash between the two leaves only the durable copy: nothing depends on the handoff.
"""

from __future__ import annotations

import logging
import shutil
from typing import Any

from ferry.engine import Loaded, list_checkpoints, load, save
from ferry.errors import FerryError
from ferry.storage import open_storage

log = logging.getLogger("ferry")


def leave(handoff_dir: str, state: Any, step: int) -> None:
    try:
        shutil.rmtree(handoff_dir, ignore_errors=True)
        save(state, handoff_dir, step=step, keep_last=1)
    except FerryError as exc:  # the durable copy is committed; the restart just reads it back
        log.warning(
            "ferry: could not leave the state in host memory (%s); the restarted "
            "worker reads the durable checkpoint instead",
            exc,
        )


def take(handoff_dir: str, durable_dir: str) -> Loaded | None:
    """The handed-over state, when it is there and not older than the durable one."""
    try:
        held = list_checkpoints(open_storage(handoff_dir))
        if not held:
            return None
        durable = list_checkpoints(open_storage(durable_dir))
        if durable and durable[-1].step > held[-1].step:
            return None
        return load(handoff_dir)
    except FerryError as exc:
        log.warning("ferry: the state handed over in memory is unusable (%s); using storage", exc)
        return None
    finally:
        shutil.rmtree(handoff_dir, ignore_errors=True)
