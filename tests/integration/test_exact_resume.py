"""Issue: exact resume in explicit mode. Each case trains in a subprocess, is interrupted
(signal, request, crash), resumes in a fresh process, and must equal the uninterrupted run
bit for bit: every parameter, every optimizer buffer, every per-step loss and RNG draw."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from ferry.runtime.control import submit
from ferry.runtime.jobdir import JobDir

from forked import Forked
from reference import reference_run
from trainrun import SCRIPTS, assert_same, env_for, run

pytestmark = pytest.mark.integration
EXIT_CHECKPOINTED = 85
SCRIPT = "train_explicit.py"

OVERLAP = {"FERRY_EVERY_STEPS": "3", "FERRY_OVERLAP_SNAPSHOT": "1"}
# (id, training args, interruption args, extra env)
CASES = [
    ("shuffle-dropout-adamw-steplr-mid-epoch", [], ["--signal-at", "17"], {}),
    (
        "no-shuffle-no-dropout-sgd-onecycle",
        ["--shuffle", "0", "--dropout", "0", "--optim", "sgd", "--sched", "onecycle"],
        ["--signal-at", "20"],
        {},
    ),
    ("workers2-shuffle", ["--workers", "2"], ["--signal-at", "17"], {}),
    (
        "accumulation3-workers2-sgd",
        ["--accum", "3", "--workers", "2", "--optim", "sgd"],
        ["--signal-at", "22"],
        {},
    ),
    ("accumulation2-mid-accumulation", ["--accum", "2", "--sched", "onecycle"], ["--signal-at", "13"], {}),
    ("at-step-0", [], ["--signal-before-loop"], {}),
    ("at-epoch-boundary", [], ["--signal-at", "12"], {}),
    ("at-last-step", [], ["--signal-at", "36"], {}),
    ("in-process-request", ["--workers", "2", "--sched", "onecycle"], ["--request-at", "30"], {}),
    ("every-5-steps-then-crash", [], ["--kill-at", "23"], {"FERRY_EVERY_STEPS": "5"}),
    ("wall-clock-then-crash", ["--sleep", "0.03"], ["--kill-at", "25"], {"FERRY_EVERY_SECONDS": "0.25"}),
    ("signal-during-async-save", ["--state-mb", "16"], ["--signal-at", "17"], {"FERRY_EVERY_STEPS": "2"}),
    ("second-signal-during-stop", [], ["--signal-at", "17", "--signal-twice"], {}),
    # The parameters and the optimizer's state (1 MiB tensors) copied during the next step.
    ("overlap-every-3-steps-then-crash", ["--width", "32768"], ["--kill-at", "23"], OVERLAP),
    ("overlap-accumulation2-signal", ["--width", "32768", "--accum", "2"], ["--signal-at", "18"], OVERLAP),
    ("sigterm-to-process-group-workers2", ["--workers", "2"], ["--killpg-at", "17"], {}),
]


def reference_for(factory: pytest.TempPathFactory, args: list[str]) -> Path:
    """The uninterrupted run of these training arguments (pacing and ballast left out: they
    do not change the results)."""
    key = tuple(a for a in args if a not in ("--sleep", "0.03") and not a.startswith("--state"))
    return reference_run(factory, SCRIPT, key)


@pytest.mark.parametrize(("case", "args", "interrupt", "extra"), CASES, ids=[c[0] for c in CASES])
def test_interrupted_run_resumes_bitwise(
    case: str,
    args: list[str],
    interrupt: list[str],
    extra: dict[str, str],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    ref = reference_for(tmp_path_factory, [a for a in args if a not in ("--state-mb", "16")])
    env = env_for(tmp_path / "home", FERRY_DIR=str(tmp_path / "ck"), **extra)
    first = run(SCRIPT, tmp_path / "run", args + interrupt, env, new_session=True)
    crashed = "--kill-at" in interrupt
    expected = -signal.SIGKILL if crashed else EXIT_CHECKPOINTED
    assert first.returncode == expected, first.stderr
    if not crashed:
        assert first.stderr.count("exiting with 85") == 1, first.stderr
    assert any((tmp_path / "ck").iterdir()), "no checkpoint was committed"
    second = run(SCRIPT, tmp_path / "run", args, env)
    assert second.returncode == 0, second.stderr
    assert "ferry: resumed from" in second.stderr
    assert_same(ref, tmp_path / "run")


def test_two_interruptions_in_a_row(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    ref = reference_for(tmp_path_factory, [])
    env = env_for(tmp_path / "home", FERRY_DIR=str(tmp_path / "ck"))
    assert run(SCRIPT, tmp_path / "run", ["--signal-at", "7"], env).returncode == EXIT_CHECKPOINTED
    assert run(SCRIPT, tmp_path / "run", ["--signal-at", "26"], env).returncode == EXIT_CHECKPOINTED
    assert run(SCRIPT, tmp_path / "run", [], env).returncode == 0
    assert_same(ref, tmp_path / "run")


def test_external_request_through_the_control_channel(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A controller drops a stop request into the job directory; the worker obeys at the next
    safe point, answers with the committed checkpoint, and exits 85."""
    ref = reference_for(tmp_path_factory, [])
    job_dir = tmp_path / "job"
    env = env_for(tmp_path / "home", FERRY_DIR=str(tmp_path / "ck"), FERRY_JOB_DIR=str(job_dir))
    proc = Forked(
        [str(SCRIPTS / SCRIPT), "--out", str(tmp_path / "run"), "--sleep", "0.05"],
        env=env,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = job_dir / "status.json"
        if status.exists() and json.loads(status.read_text()).get("step", 0) >= 3:
            break
        time.sleep(0.05)
    job = JobDir.open(str(job_dir))
    rid = submit(job, "stop")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_CHECKPOINTED, err
    answer = json.loads((job_dir / "control" / f"resp-{rid}.json").read_text())
    assert answer["ok"] and answer["step"] >= 3 and Path(answer["url"]).exists()
    assert json.loads((job_dir / "status.json").read_text())["state"] == "checkpointed"
    second = run(SCRIPT, tmp_path / "run", ["--sleep", "0.03"], env)
    assert second.returncode == 0, second.stderr
    assert_same(ref, tmp_path / "run")


def test_stop_that_cannot_commit_exits_with_the_failure_code(tmp_path: Path) -> None:
    """The checkpoint root cannot be created: the save fails, the job says why and exits 86."""
    env = env_for(tmp_path / "home", FERRY_DIR="/proc/ferry-cannot-write-here")
    proc = run(SCRIPT, tmp_path / "run", ["--signal-at", "5"], env)
    assert proc.returncode == 86, proc.stderr
    assert "could not commit a checkpoint before stopping" in proc.stderr
