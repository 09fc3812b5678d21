"""What a saved loader position depends on, and what a resume may not silently change.

A position is "batch 37 of epoch 2": it means the same samples only with the same batch
size, dataset length, sampler and ``drop_last`` (the number of ranks is checked where the
ranks' parts are read, session/resume.py). A checkpoint records these per loader, and the
command line it was taken under; ``changes`` compares them with the resumed run's and
``verdict`` decides: a changed position input refuses the resume (unless
``allow_changed_inputs``), a changed command line only warns, since adding epochs or
changing a log interval is what a resume is often for. Both are pure functions, tested
from tables (tests/unit/test_loader_inputs.py).
"""

from __future__ import annotations

import enum
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from torch.utils.data import DataLoader

OVERRIDE = "ferry run --allow-changed-inputs (FERRY_ALLOW_CHANGED_INPUTS=1)"
"""How to resume anyway; named in every refusal."""


def loader_inputs(loader: DataLoader[Any]) -> dict[str, Any]:
    """The facts a position of ``loader`` depends on, as plain JSON values."""
    try:
        length: int | None = len(loader.dataset)  # type: ignore[arg-type]
    except (TypeError, NotImplementedError):  # a dataset without a length
        length = None
    sampler = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    inner = getattr(sampler, "sampler", sampler)  # a BatchSampler's own sampler decides the order
    return {
        "batch_size": loader.batch_size,
        "dataset_length": length,
        "sampler": type(inner).__qualname__,
        "drop_last": bool(loader.drop_last),
    }


def changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """``name old -> new`` for every recorded input that differs (inputs one side lacks,
    e.g. in a checkpoint older than the record, are not compared)."""
    return [
        f"{key} {saved[key]!r} -> {now[key]!r}"
        for key in sorted(saved.keys() & now.keys())
        if saved[key] != now[key]
    ]


def command_change(saved: Sequence[str] | None, now: Sequence[str]) -> str | None:
    """``command line 'old' -> 'new'`` when the script's arguments differ; None when they
    match or the checkpoint did not record them. The interpreter's path is left out: a job
    moved to another machine or venv runs the same command."""
    if saved is None or list(saved) == list(now):
        return None
    return f"command line {shlex.join(saved)!r} -> {shlex.join(now)!r}"


class Verdict(enum.Enum):
    SAME = "same"
    WARN = "warn"
    REFUSE = "refuse"


def verdict(position_changes: Sequence[str], *, command_changed: bool, allowed: bool) -> Verdict:
    """Refuse a resume whose positions would mean other samples, unless allowed; warn about
    a changed command line, and about overridden changes."""
    if position_changes:
        return Verdict.WARN if allowed else Verdict.REFUSE
    return Verdict.WARN if command_changed else Verdict.SAME


def refusal(where: str, loader: str, position_changes: Sequence[str]) -> str:
    return (
        f"{where}: the position of loader {loader} was saved with other inputs "
        f"({', '.join(position_changes)}); resuming would train a different epoch: resume with "
        f"the original inputs, start fresh in another --dir, or resume anyway with {OVERRIDE}"
    )
