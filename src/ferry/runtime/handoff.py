"""Hand the state over in host memory across an in-place restart.

A worker that stops so that `ferry run` can start it again (a ``restart`` request, a
migration to other devices) commits its checkpoint to durable storage as always, and
leaves a second copy in ``handoff_dir``, a tmpfs folder: host memory. The copy is written from
the same snapshot while the durable one is (``leave`` is the save's mirror:
``ferry.engine.asyncsave``), so it costs neither a second snapshot nor a second wait. The restarted worker
loads that copy when it is of the same step as the newest durable checkpoint, and removes
it. A crash between the two leaves only the durable copy: nothing depends on the handoff.

The copy is a cache of the durable checkpoint, never a source of its own: the restarted
worker gets the copy's state under the durable checkpoint's URL and manifest, so whatever
else it reads of the checkpoint later (the files of a ``FunctionCheckpoint``) comes from
storage, after the copy is gone.

/dev/shm is shared by every user, and the folder's name can be computed by anyone: it is
used only inside a parent folder that this user owns, nobody else may enter (0700) and is
not a symlink, and it is created afresh, exclusively, by the worker that leaves the state.
Anything else found there is refused with one line, and the durable checkpoint is used.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from dataclasses import replace
from typing import TYPE_CHECKING

from ferry.errors import FerryError, JobError
from ferry.runtime.jobdir import dir_problem
from ferry.storage import open_storage

if TYPE_CHECKING:
    from ferry.engine import Loaded
    from ferry.engine.codec import Flattened

log = logging.getLogger("ferry")


def _problem(path: str) -> str | None:
    """Why the existing folder ``path`` is not this user's private one (None when it is)."""
    st = os.lstat(path)
    problem = dir_problem(st, os.geteuid())
    if problem is None and st.st_mode & 0o077:
        problem = f"may be read by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return problem


def _checked(handoff_dir: str) -> bool:
    """True when ``handoff_dir`` exists and it and its parent are this user's private
    folders; False when it does not exist; JobError naming the problem otherwise."""
    for path in (os.path.dirname(handoff_dir), handoff_dir):
        try:
            problem = _problem(path)
        except FileNotFoundError:
            return False
        if problem is not None:
            raise JobError(f"the hand-over folder {path} {problem}")
    return True


def _fresh(handoff_dir: str) -> None:
    """Make ``handoff_dir`` an empty folder created by this process, in a private parent."""
    parent = os.path.dirname(handoff_dir)
    with contextlib.suppress(FileExistsError):
        os.mkdir(parent, 0o700)
    if _checked(handoff_dir):
        shutil.rmtree(handoff_dir)
    _checked(handoff_dir)  # the parent again, when the folder was not there
    os.mkdir(handoff_dir, 0o700)  # exclusive: fails if anything appeared meanwhile


def leave(handoff_dir: str, flat: Flattened, host: memoryview, step: int) -> None:
    """Write the snapshot ``host`` of ``flat`` at ``step`` as the only checkpoint in a fresh
    ``handoff_dir``; a failure is logged (the durable copy is the one that counts)."""
    from ferry.engine.persist import persist  # here: the supervisor imports this module without torch

    try:
        _fresh(handoff_dir)
        persist(open_storage(handoff_dir), flat, host, step)
    except (FerryError, OSError) as exc:  # the durable copy is committed; the restart reads it
        log.warning(
            "ferry: could not leave the state in host memory (%s); the restarted "
            "worker reads the durable checkpoint instead",
            exc,
        )


def take(handoff_dir: str, durable_dir: str) -> Loaded | None:
    """The handed-over state, under the newest durable checkpoint's URL and manifest, when
    the copy is this user's own and of that checkpoint's step; None otherwise."""
    from ferry.engine import list_checkpoints, load, read_manifest  # as in leave

    try:
        if not _checked(handoff_dir):
            return None
    except (JobError, OSError) as exc:
        log.warning("ferry: %s: not used; resuming from the durable checkpoint", exc)
        return None
    try:
        held = list_checkpoints(open_storage(handoff_dir))
        durable = list_checkpoints(open_storage(durable_dir))
        if not held or not durable or durable[-1].step != held[-1].step:
            return None
        newest = durable[-1]
        manifest = read_manifest(open_storage(durable_dir), newest.name)
        return replace(load(handoff_dir), url=newest.url, manifest=manifest)
    except FerryError as exc:
        log.warning("ferry: the state handed over in memory is unusable (%s); using storage", exc)
        return None
    finally:
        discard(handoff_dir)


def discard(handoff_dir: str) -> None:
    """Remove the hand-over folder, when it is this user's own (nothing else is touched)."""
    try:
        if _checked(handoff_dir):
            shutil.rmtree(handoff_dir, ignore_errors=True)
    except (JobError, OSError):
        pass
