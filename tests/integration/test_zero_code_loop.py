"""Zero-code mode says what it cannot capture in the training loop's frames, naming the
file and line and the explicit line that fixes it (docs/zero-code.md, "What it cannot
capture")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainrun import SCRIPTS, env_for

pytestmark = pytest.mark.integration


def test_what_zero_code_cannot_capture_is_said_with_file_line_and_fix(tmp_path: Path) -> None:
    from ferry.autotrack import BOOT_DIR

    env = env_for(
        tmp_path / "home",
        FERRY_AUTOTRACK="1",
        PYTHONPATH=f"{BOOT_DIR}:{os.environ.get('PYTHONPATH', '')}",
        FERRY_DIR=str(tmp_path / "ck"),
        FERRY_EVERY_STEPS="3",
    )
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "zc_uncaptured.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "8 8\n"
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("ferry: warning:")]
    assert warnings == [
        "ferry: warning: zc_uncaptured.py:33 (in main): a `for` loop iterates a generator, whose position "
        "zero-code mode cannot read: after a resume it starts over; to make it exact: iterate a DataLoader "
        "or a range, or skip what `ferry.global_step` says is done",
        "ferry: warning: zc_uncaptured.py:33 (in main): `stats` (a local) changes during training and "
        "zero-code mode does not capture it: after a resume it holds only what the resumed run puts in; "
        "to make it exact: keep plain values in it (numbers, strings, tensors, arrays, lists and dicts of "
        "those): zero-code mode captures those",
    ], proc.stderr
    lines = proc.stderr.splitlines()
    first_save = next(i for i, line in enumerate(lines) if line.startswith("ferry: checkpoint step 3 ->"))
    assert all(lines.index(w) < first_save for w in warnings)  # said before the first save, once each
