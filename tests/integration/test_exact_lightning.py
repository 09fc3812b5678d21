"""Lightning's own loop under ferry, stopped and resumed (issue 28; issue 26 item 3).

One public-style script (``scripts/lightning_fit.py``: ModelCheckpoint top-2 and last,
EarlyStopping, CSVLogger, validation twice an epoch, ``on_save_checkpoint`` hooks, then
``predict``), never changed for ferry. Each lineage stops it several times under ``ferry
run`` (mid-epoch, during validation, at the end of an epoch) and compares the end with the
plain run: every printed line (the stopped runs' lines followed by the resumed ones'), the
metrics file and hyperparameters, the final weights and optimizer state, and the content of
every checkpoint Lightning wrote (weights, optimizer, schedulers, loops, callbacks)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

import compat
from trainrun import SCRIPTS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("lightning") is None, reason="pip install 'gpuferry[lightning]'"
    ),
]
PACE = ["--sleep", "0.4", "--val-sleep", "0.3"]
"""Seconds per batch in the ferry runs: a stop lands inside the batch it was sent in."""
CHECKPOINTED = re.compile(r"checkpointed at step (\d+), exiting with 85")


def _argv(*extra: str) -> list[str]:
    return [sys.executable, str(SCRIPTS / "lightning_fit.py"), *extra]


def _env(home: Path) -> dict[str, str]:
    return compat.env_for(home, OMP_NUM_THREADS="1")


def _binary_aside(outcome: compat.Outcome) -> dict[str, str]:
    """Lightning's .ckpt files name the working folder inside; the script prints a digest of
    each one's content with that folder made relative (compared with stdout)."""
    return {name: text for name, text in outcome.files.items() if not name.endswith(".ckpt")}


def _stopped_at(outcome: compat.Outcome) -> int:
    assert outcome.returncode == 85, "\n".join(outcome.log[-30:])
    found = [int(m.group(1)) for line in outcome.ferry if (m := CHECKPOINTED.search(line))]
    assert len(found) == 1, outcome.ferry
    return found[0]


@pytest.fixture(scope="module")
def plain_one(tmp_path_factory: pytest.TempPathFactory) -> compat.Outcome:
    tmp = tmp_path_factory.mktemp("lightning-plain")
    ref = compat.plain(_argv(), tmp / "run", _env(tmp / "home"))
    assert ref.returncode == 0, "\n".join(ref.log[-30:])
    return ref


def test_stopped_three_times_resumes_to_the_plain_run(plain_one: compat.Outcome, tmp_path: Path) -> None:
    """Stopped mid-epoch (no validation after the batch), during the mid-epoch validation, and
    at the end of an epoch (after its validation), each resumed in a new process: together
    they print what the plain run prints, end with its weights and optimizer state, write its
    metrics.csv row for row in one version folder, and Lightning's checkpoints hold what the
    plain run's hold. The SIGTERM goes through Lightning's own handler's place: each stop ends
    in a committed checkpoint and exit 85 (Lightning's handler alone ended fit with exit 0)."""
    work, env = tmp_path / "run", _env(tmp_path / "home")
    stops = [
        compat.StopAfter("stdout", 2, containing=" loss "),  # mid-epoch: the end of step 2
        compat.StopAfter("stdout", 1, containing="validating at step 12"),
        compat.StopAfter("stdout", 1, containing="batch 7 step 16 "),  # the last batch of epoch 1
    ]
    printed: list[str] = []
    steps = []
    for stop in stops:
        got = compat.under_ferry(_argv(*PACE), work, env, stop=stop)
        steps.append(_stopped_at(got))
        printed += got.stdout
        assert "Received SIGTERM" not in "\n".join(got.stderr)  # Lightning's handler never ran
    assert steps[0] % 4 != 0 and steps[1:] == [12, 16], steps
    final = compat.under_ferry(_argv(*PACE), work, env)
    assert final.returncode == 0, "\n".join(final.log[-30:])
    assert sum("resumed from" in line for line in final.ferry) == 1
    assert printed + final.stdout == plain_one.stdout
    assert final.stderr == plain_one.stderr  # no warning the plain run does not print
    assert _binary_aside(final) == _binary_aside(plain_one)
    assert final.exit_lag < 5
