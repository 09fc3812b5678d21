"""``ferry prune``: which job directories to delete, and deleting them (and their checkpoints).

A job qualifies when it is not alive, its last state is finished, failed or checkpointed,
and that end lies longer ago than the age given. A job that died without a word ("dead")
is left alone: nobody recorded how it ended, and its checkpoints may be the only way back.
``select`` is a pure function of plain values (tested from a table); the rest is I/O.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from dataclasses import dataclass

from ferry.engine.catalog import apply_retention, list_checkpoints
from ferry.errors import ConfigError
from ferry.ops.jobs import DONE_STATES, JobRecord
from ferry.runtime.finished import clear_finished
from ferry.storage import open_storage

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` (a bare number: seconds) -> seconds."""
    raw = text.strip().lower()
    unit = raw[-1:] if raw[-1:] in _UNITS else "s"
    number = raw[:-1] if raw[-1:] in _UNITS else raw
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ConfigError(f"{text!r} is not an age: give e.g. 30d, 12h, 90m or 45s")
    if value < 0:
        raise ConfigError(f"{text!r} is negative: give an age, e.g. 30d, 12h, 90m or 45s")
    return value * _UNITS[unit]


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """What ``select`` needs to know of one job directory."""

    id: str
    alive: bool
    state: str
    ended: float | None
    """When it ended (epoch seconds): its status's ``ended``, else its last update."""


def select(jobs: list[Candidate], older_than: float, now: float) -> list[str]:
    """The ids of the jobs to prune: ended (finished, failed, checkpointed) and not alive,
    longer than ``older_than`` seconds before ``now``."""
    return [
        j.id
        for j in jobs
        if not j.alive and j.state in DONE_STATES and j.ended is not None and now - j.ended > older_than
    ]


def candidate(record: JobRecord) -> Candidate:
    status = record.status
    ended = status.get("ended") or status.get("updated")
    return Candidate(id=record.id, alive=record.alive, state=record.state, ended=ended)


@dataclass
class Pruned:
    """One pruned job: what went (or, with ``--dry-run``, would go)."""

    id: str
    job_dir: str
    checkpoint_dir: str | None
    checkpoints_removed: list[str]
    checkpoints_kept_because: str | None = None


def prune_job(record: JobRecord, *, checkpoints: bool, shared: set[str], dry_run: bool) -> Pruned:
    """Delete one job's directory and, with ``checkpoints``, the checkpoints ferry wrote under
    its checkpoint root, unless another job that stays uses that root (``shared``). The root
    itself is removed only when that leaves it empty: it may hold the user's own files."""
    ckpt = record.identity.get("checkpoint_dir")
    out = Pruned(record.id, record.dir.path, ckpt, [])
    if checkpoints and ckpt:
        if ckpt in shared:
            out.checkpoints_kept_because = "another job that stays uses the same checkpoint root"
        else:
            out.checkpoints_removed = _remove_checkpoints(ckpt, dry_run)
    if not dry_run:
        shutil.rmtree(record.dir.path)
    return out


def _remove_checkpoints(url: str, dry_run: bool) -> list[str]:
    storage = open_storage(url)
    try:
        names = [r.url for r in list_checkpoints(storage)]
    except FileNotFoundError:  # removed already
        return []
    if dry_run:
        return names
    apply_retention(storage, 0)  # keep none: every checkpoint, and staging left by a crash
    clear_finished(url)  # the record that its job finished goes with them
    if "://" not in url:
        with contextlib.suppress(OSError):
            os.rmdir(url)  # only when empty
    return names
