"""What a soak compares: the command's output files in the reference's working copy and
in a chaos round's (docs/chaos.md, "The contract with your script")."""

from __future__ import annotations

import filecmp
import os
from collections.abc import Sequence


def step_record(path: str) -> tuple[dict[int, str], int]:
    """The last line written for each step (lines that start with an integer), and how
    many step lines there were in all (more than steps: work was recomputed)."""
    last: dict[int, str] = {}
    total = 0
    with open(path, errors="replace") as f:
        for line in f:
            key = line.split(" ", 1)[0]
            if key.isdigit() and line.endswith("\n"):
                last[int(key)] = line
                total += 1
    return last, total


def compare_outputs(
    ref: str, run: str, compare: Sequence[str], steps: Sequence[str]
) -> tuple[list[str], int, int]:
    """Differences between two working copies; the steps per run and the recomputed ones
    (from the first ``steps`` log). ``compare``: files equal byte for byte; ``steps``:
    per-step logs, the last line per step equal."""
    diffs: list[str] = []
    n_steps = recomputed = 0
    for name in compare:
        a, b = os.path.join(ref, name), os.path.join(run, name)
        if not os.path.isfile(b):
            diffs.append(f"{name}: missing in the chaos run")
        elif not filecmp.cmp(a, b, shallow=False):
            diffs.append(f"{name}: differs")
    for i, name in enumerate(steps):
        if not os.path.isfile(os.path.join(run, name)):
            diffs.append(f"{name}: missing in the chaos run")
            continue
        want, _ = step_record(os.path.join(ref, name))
        got, total = step_record(os.path.join(run, name))
        if i == 0:
            n_steps, recomputed = len(got), total - len(got)
        if set(want) != set(got):
            diffs.append(f"{name}: steps {len(got)} != reference {len(want)}")
        bad = [s for s in sorted(want) if s in got and got[s] != want[s]]
        if bad:
            diffs.append(f"{name}: {len(bad)} step(s) differ, first: step {bad[0]}")
    return diffs, n_steps, recomputed


def absolute_command(command: Sequence[str]) -> list[str]:
    """Arguments that name an existing file or folder here are made absolute, because the
    command runs in a working copy of its own (``train.py`` keeps working, ``--out out``
    stays relative to the working copy)."""
    return [os.path.abspath(a) if not a.startswith("-") and os.path.exists(a) else a for a in command]
