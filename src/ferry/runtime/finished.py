"""The record that a job finished, kept in its checkpoint root as ``finished.json``.

``ferry run`` writes it when the worker exits 0 (the script returned): a later run of the
same job finds it and says so instead of resuming from the last checkpoint and training
the steps after it again. ``ferry run --fresh`` removes it, with the checkpoints. It sits
in the root beside the checkpoints (outside their ``step-*`` names, which the catalog and
retention look at), so that it travels with them: the same root is the same job's, on any
host and under any job id.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from ferry.errors import FerryError
from ferry.storage import open_storage
from ferry.typedjson import SchemaError, loads, parse

FINISHED = "finished.json"
MAX_BYTES = 64 << 10
"""A few hundred bytes when ferry writes it; a bigger file is not ferry's and is not read."""


class Finished(TypedDict):
    job: str
    """The id of the job that finished."""
    step: int | None
    """Its last training step, when the job's status knew it."""
    time: float
    """When it finished (epoch seconds)."""
    command: list[str]
    """The command line that ran to its end."""


def write_finished(root: str, *, job: str, step: object, command: Sequence[str]) -> str | None:
    """Record in ``root`` that ``job`` finished at ``step``; a warning when it cannot (the job
    did finish: the record only spares a rerun, so its failure changes no outcome). A job
    that never saved a checkpoint there gets no record: it leaves no folder behind, as the
    plain command would not, and a run of it again has nothing to resume anyway."""
    from ferry.engine.catalog import list_checkpoints

    doc: Finished = {
        "job": job,
        "step": step if isinstance(step, int) and not isinstance(step, bool) else None,
        "time": time.time(),
        "command": list(command),
    }
    try:
        storage = open_storage(root)
        if not storage.exists("") or not list_checkpoints(storage):
            return None
        storage.write_bytes(FINISHED, json.dumps(doc, indent=1).encode())
    except (OSError, FerryError) as exc:
        return (
            f"ferry run: warning: cannot record in {root} that the job finished ({exc}): running "
            "it again resumes from its last checkpoint"
        )
    return None


def read_finished(root: str) -> Finished | None:
    """The record in ``root``; None where there is none, or it is not one ferry wrote (a file
    that is too big or malformed is left alone: the job then runs as if it had none)."""
    try:
        storage = open_storage(root)
        if not storage.exists(FINISHED) or storage.size(FINISHED) > MAX_BYTES:
            return None
        return parse(loads(storage.read_bytes(FINISHED)), Finished, FINISHED)
    except (OSError, ValueError, SchemaError, FerryError):  # unreadable: as if there were none
        return None


@dataclass(frozen=True)
class Verdict:
    """What ``ferry run`` makes of a root's record, before it starts anything."""

    done: bool
    """The same command finished there: nothing to train (exit 0)."""
    line: str
    """What it says: why it trains nothing, or the warning with which it goes on."""


def verdict(root: str, command: Sequence[str]) -> Verdict | None:
    """None where the root records no end. The same command line that finished there: done.
    Another one (more epochs, a new --job-id on the same --dir) finished there: it goes on
    from the root's newest checkpoint, as it would have without the record, which is
    removed (the root is this command's from now on), with a warning that names the steps
    it may train again."""
    record = read_finished(root)
    if record is None:
        return None
    at = time.strftime("%Y-%m-%d %H:%M", time.localtime(record["time"]))
    step = "?" if record["step"] is None else record["step"]
    if record["command"] == list(command):
        return Verdict(
            True,
            f"ferry run: job {record['job']} finished at step {step} on {at} ({root}/{FINISHED}): "
            "nothing to do; run it with --fresh to train it again from scratch",
        )
    from ferry.engine.catalog import list_checkpoints

    refs = list_checkpoints(open_storage(root))
    newest = refs[-1].step if refs else None
    clear_finished(root)
    return Verdict(
        False,
        f"ferry run: warning: {root} holds a job that finished at step {step} on {at} with another "
        f"command line ({shlex.join(record['command'])}); this one goes on from its newest "
        f"checkpoint, step {newest}"
        + ("" if newest == record["step"] else ", and may train steps after it again"),
    )


def clear_finished(root: str) -> None:
    """Forget that the job of ``root`` finished (``ferry resume`` starts it again on purpose)."""
    storage = open_storage(root)
    if storage.exists(FINISHED):
        storage.remove(FINISHED)


def start_over(root: str) -> str:
    """Delete every checkpoint under ``root`` and its finished record (``ferry run --fresh``);
    returns the line that says what went. Only while this process holds the root
    (``rootlock``): retention deletes what it finds, whoever saved it."""
    from ferry.engine.catalog import apply_retention, list_checkpoints

    storage = open_storage(root)
    steps = [r.step for r in list_checkpoints(storage)] if storage.exists("") else []
    if steps:
        apply_retention(storage, 0)  # keep none: every checkpoint, and staging left by a crash
    clear_finished(root)
    listed = ", ".join(map(str, steps))
    what = f"deleted {len(steps)} checkpoint(s), of step(s) {listed}" if steps else "no checkpoint"
    return f"ferry run: --fresh: starting over ({what} under {root})"
