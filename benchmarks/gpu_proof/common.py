"""What the parts of ``benchmarks/gpu_proof.sh`` share: result rows, progress lines, sizes.

Each part appends its rows, one JSON object a line, to ``$GPU_PROOF_RESULTS`` as soon as it
has them (a part killed by its timeout keeps what it had); ``summary.py`` turns them into
``summary.md``. A row's status is PASS, FAIL, UNAVAILABLE (the machine cannot do it: said
why, never a pass) or SKIPPED (not run here: said why).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

STATUSES = ("PASS", "FAIL", "UNAVAILABLE", "SKIPPED")
SMALL = os.environ.get("GPU_PROOF_SIZE", "full") == "small"
"""``GPU_PROOF_SIZE=small``: tiny sizes, to try the script's logic on any machine."""
DRY = bool(os.environ.get("GPU_PROOF_DRY"))
"""``GPU_PROOF_DRY=1``: the parts that can run on the CPU do, for a try of their logic; their
rows say SKIPPED ("dry run without a GPU, would be PASS"), never PASS."""


def say(message: str) -> None:
    """A progress line with the time of day."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def row(part: str, check: str, figure: str, goal: str, status: str, note: str = "") -> None:
    """One line of the summary's table, written at once."""
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is none of {STATUSES}")
    if DRY and status in ("PASS", "FAIL"):
        note = f"dry run without a GPU, would be {status}" + (f"; {note}" if note else "")
        status = "SKIPPED"
    doc: dict[str, Any] = {"part": part, "check": check, "figure": figure, "goal": goal, "status": status}
    if note:
        doc["note"] = note
    say(f"{status}: {check}: {figure} (goal {goal}){' - ' + note if note else ''}")
    path = os.environ.get("GPU_PROOF_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(doc) + "\n")


def plan(part: str, checks: tuple[str, ...] | list[str]) -> None:
    """The checks ``part`` means to make: ``summary.py`` lists each that has no row."""
    path = os.environ.get("GPU_PROOF_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"part": part, "plan": list(checks)}) + "\n")


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def why_no_cuda() -> str | None:
    """None when torch sees a CUDA GPU here; else why not."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU"
    return None
