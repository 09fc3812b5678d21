"""A timm-style training script (tests/integration/scripts/zc_timm.py: `train_one_epoch`
with a closure over its arguments, AverageMeters, a prefetching generator wrapper,
persistent workers, an evaluation loader, a per-update scheduler, a summary CSV and a
best-model file), run plain and under `ferry run`, uninterrupted and stopped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import compat
from trainrun import SCRIPTS

pytestmark = pytest.mark.integration

ARGV = [sys.executable, str(SCRIPTS / "zc_timm.py"), "--out", "out", "--epochs", "3"]


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> compat.Outcome:
    tmp = tmp_path_factory.mktemp("timm-plain")
    return compat.plain(ARGV, tmp / "run", compat.env_for(tmp / "home"), timeout=240)


def test_uninterrupted_under_ferry_is_the_plain_run(plain_run: compat.Outcome, tmp_path: Path) -> None:
    got = compat.under_ferry(ARGV, tmp_path / "run", compat.env_for(tmp_path / "home"), timeout=240)
    compat.assert_same(plain_run, got, streams=("stdout",))


def test_stopped_mid_epoch_resumes_as_the_plain_run_and_exits(
    plain_run: compat.Outcome, tmp_path: Path
) -> None:
    """Stopped inside epoch 1 (its pools persistent, the evaluation's made in epoch 0), while
    the prefetching generator holds the next batch: its frame comes back with it, the loader
    continues after it, `batch_idx` counts on. The resumed process once never exited (its
    training pool held past the script's end)."""
    env = compat.env_for(tmp_path / "home")
    stop = compat.StopAfter("out/log.txt", 9)  # 7 lines an epoch (every 2nd batch and the last)
    stopped = compat.under_ferry([*ARGV, "--sleep", "0.1"], tmp_path / "run", env, stop=stop, timeout=240)
    assert stopped.returncode == 85, "\n".join(stopped.log)
    resumed = compat.under_ferry(ARGV, tmp_path / "run", env, timeout=240)
    assert resumed.exit_lag < 10, f"the resumed job took {resumed.exit_lag:.1f} s to exit after its last line"
    assert not [line for line in stopped.ferry + resumed.ferry if "warning: not restored" in line or
                "starts over" in line], stopped.ferry + resumed.ferry  # fmt: skip
    compat.assert_same(plain_run, resumed, streams=())
