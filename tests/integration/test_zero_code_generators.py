"""A loop over generators that wrap the DataLoader (tests/integration/scripts/zc_generators.py:
one passes batches through with ``yield from``, one adds noise from the global random stream,
one holds the next batch ahead), stopped mid-epoch under `ferry run` and resumed: the same
lines, steps and weights as the plain run. The generators run at each safe point, so their
frames are captured with the loop's (docs/zero-code.md, "Training passes, evaluation passes,
prefetching wrappers"); timm's own shape is test_compat_timm.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import compat
from trainrun import SCRIPTS

pytestmark = pytest.mark.integration

ARGV = [sys.executable, str(SCRIPTS / "zc_generators.py")]


def test_nested_generator_wrappers_resume_as_the_plain_run(tmp_path: Path) -> None:
    ref = compat.plain(ARGV, tmp_path / "plain", compat.env_for(tmp_path / "home-plain"), timeout=180)
    assert len(ref.stdout) == 16
    env = compat.env_for(tmp_path / "home")
    stop = compat.StopAfter("stdout", 11)  # inside the second epoch (8 batches each)
    argv = [*ARGV, "--sleep", "0.1"]
    stopped = compat.under_ferry(argv, tmp_path / "run", env, stop=stop, timeout=180)
    assert stopped.returncode == 85, "\n".join(stopped.log)
    resumed = compat.under_ferry(argv, tmp_path / "run", env, timeout=180)
    assert stopped.stdout + resumed.stdout == ref.stdout
    assert not [line for line in stopped.ferry + resumed.ferry if "warning" in line], (
        stopped.ferry + resumed.ferry
    )
    compat.assert_same(ref, resumed, streams=())
