"""Zero-code mode and the loaders real scripts make: evaluation loaders built at every call
(identity by construction site), random augmentation in DataLoader workers (replayed mid
epoch), changed inputs (refused, or warned about), and loaders that keep their own position
(StatefulDataLoader's protocol). Each test is one lineage of `ferry run`s, stopped at chosen
steps by the script itself (FERRY_TEST_STOP_AT), compared with the plain uninterrupted run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reference import reference_run
from trainrun import SCRIPTS, env_for

pytestmark = pytest.mark.integration
FERRY = str(Path(sys.executable).parent / "ferry")
SCRIPT = "zc_loaders.py"


def ferry_run(
    tmp: Path, out: Path, args: list[str], *, stop_at: str = "", script: Path = SCRIPTS / SCRIPT
) -> subprocess.CompletedProcess[str]:
    cmd = [FERRY, "run", "--dir", str(tmp / "ck"), "--job-id", "zcl", "--",
           sys.executable, str(script), "--out", str(out), *args]  # fmt: skip
    env = env_for(tmp / "home", FERRY_TEST_STOP_AT=stop_at)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)


def stopped_at(proc: subprocess.CompletedProcess[str], step: int) -> None:
    assert proc.returncode == 85, proc.stderr
    assert f"checkpointed at step {step}" in proc.stderr, proc.stderr


def same_run(ref: Path, got: Path) -> None:
    """Every printed line (steps, losses, the data's bits, evaluations), the final weights
    and the best model the script saved, as in the uninterrupted run."""
    assert (got / "log.txt").read_text().splitlines() == (ref / "log.txt").read_text().splitlines()
    assert (got / "params.txt").read_text() == (ref / "params.txt").read_text()
    if (ref / "best.pt").exists():
        a, b = torch.load(ref / "best.pt"), torch.load(got / "best.pt")
        assert a["correct"] == b["correct"]
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_evaluation_per_call_worker_augmentation_and_changed_inputs(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """One lineage. evaluate() builds a new test loader at every call; the training loader
    has 2 workers whose Dataset.__getitem__ draws random crops/flips (torch, random, numpy).
    Stopped after 5 batches of a 10-batch epoch (odd: one worker's batch of the round is
    consumed, the other's is not), then at an epoch boundary (step 20), it ends as the plain
    run: every printed line (losses, the batches' bits, each evaluation's full `Test: N/M`,
    never `0/0`), the weights and the best model it saved. Between the two, a resume with
    another batch size is refused in one line naming the change and the override. The last
    resume runs an edited copy of the script (every line one lower): the training loader
    still finds its position."""
    args = ["--workers", "2", "--augment"]
    ref = reference_run(tmp_path_factory, SCRIPT, tuple(args))
    out = tmp_path / "run"
    first = ferry_run(tmp_path, out, args, stop_at="5")
    stopped_at(first, 5)
    assert f"ferry: no checkpoint under {tmp_path / 'ck'}: starting fresh" in first.stderr
    refused = ferry_run(tmp_path, tmp_path / "other", [*args, "--batch-size", "4"])
    assert refused.returncode == 2, refused.stderr
    (line,) = [ln for ln in refused.stderr.splitlines() if ln.startswith("ferry: error:")]
    assert "batch_size 8 -> 4" in line and "--allow-changed-inputs" in line, refused.stderr
    assert "Traceback" not in refused.stderr
    assert "command line" in refused.stderr  # the changed argv is named too (a warning)
    second = ferry_run(tmp_path, out, args, stop_at="20")
    stopped_at(second, 20)
    assert "resumed from" in second.stderr
    edited = tmp_path / "edited" / SCRIPT
    edited.parent.mkdir()
    edited.write_text("# a comment added after the checkpoint\n" + (SCRIPTS / SCRIPT).read_text())
    third = ferry_run(tmp_path, out, args, script=edited)
    assert third.returncode == 0, third.stderr
    assert third.stderr.count("is taken for the one saved as built at zc_loaders.py:") == 2, third.stderr
    assert "Test: 0/0" not in (out / "log.txt").read_text()
    same_run(ref, out)


def test_a_loader_with_its_own_state_dict_resumes_through_it(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A loader with StatefulDataLoader's protocol (its own __iter__, state_dict,
    load_state_dict) is tracked, its batches are the safe points, and the resume goes through
    its load_state_dict: the run ends as the plain one. torchdata's own StatefulDataLoader
    is used as well when it is installed."""
    args = ["--stateful", "--steps", "16", "--eval-every", "100"]
    ref = reference_run(tmp_path_factory, SCRIPT, tuple(args))
    out = tmp_path / "run"
    stopped_at(ferry_run(tmp_path, out, args, stop_at="7"), 7)
    saved = next(p for p in (tmp_path / "ck").iterdir() if p.name.startswith("step-"))
    assert b"loader_state" in (saved / "manifest.json").read_bytes() + (saved / "data-0.bin").read_bytes()
    last = ferry_run(tmp_path, out, args)
    assert last.returncode == 0, last.stderr
    same_run(ref, out)


def test_an_epoch_loop_that_builds_its_training_loader_each_epoch(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`for epoch in ...: loader = DataLoader(...); for batch in loader:`. Each epoch's loader
    takes over as the training loader; stopped in the third epoch and resumed, the loaders
    of the two finished epochs are empty, the saved one resumes mid-epoch, and the run ends
    as the plain one."""
    args = ["--epochs", "4", "--eval-every", "100"]
    ref = reference_run(tmp_path_factory, SCRIPT, tuple(args))
    out = tmp_path / "run"
    stopped_at(ferry_run(tmp_path, out, args, stop_at="23"), 23)
    last = ferry_run(tmp_path, out, args)
    assert last.returncode == 0, last.stderr
    same_run(ref, out)
