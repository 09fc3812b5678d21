"""Checkpoint requests are served, or said to be dropped: never lost in silence."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainrun import SCRIPTS, env_for

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("after", "step"), [(200, 301), (0, 300)])
def test_explicit_checkpoint_under_a_one_rank_group_is_served(after: int, step: int, tmp_path: Path) -> None:
    """A 1-rank gloo group (a DTensor model) agreed only every few hundred fast steps: a
    `ferry.checkpoint()` followed by 200 steps committed nothing, and `ferry.close()` dropped
    it without a word. Now it is served at the next step, or by close()."""
    env = env_for(tmp_path / "home", FERRY_DIR=str(tmp_path / "ck"))
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "explicit_pg.py"), "--after", str(after)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"['step-{step:012d}']", proc.stderr
    assert f"ferry: checkpoint step {step} ->" in proc.stderr
