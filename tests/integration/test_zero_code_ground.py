"""Zero-code mode's ground rules, each on a real script stopped and resumed through
`ferry run`, compared with the plain uninterrupted run as the user sees it: exit code,
printed lines (ferry's own aside) and every file the job wrote."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import compat
from trainrun import SCRIPTS

pytestmark = pytest.mark.integration


def lineage(
    tmp: Path, script: str, stop: compat.StopAfter, *args: str, slow: tuple[str, ...] = ("--sleep", "0.1")
) -> tuple[compat.Outcome, compat.Outcome, compat.Outcome]:
    """(plain run, stopped run, resumed run) of ``script``; the stopped run is slowed by
    ``slow`` so that the stop lands where the test wants it."""
    argv = [sys.executable, str(SCRIPTS / script), "--out", "out", *args]
    ref = compat.plain(argv, tmp / "plain", compat.env_for(tmp / "h0"), timeout=180)
    env = compat.env_for(tmp / "h1")
    stopped = compat.under_ferry([*argv, *slow], tmp / "ferry", env, stop=stop, timeout=180)
    assert stopped.returncode == 85, "\n".join(stopped.log)
    resumed = compat.under_ferry(argv, tmp / "ferry", env, timeout=180)
    return ref, stopped, resumed


def checkpointed_step(run: compat.Outcome) -> int:
    line = next(x for x in run.ferry if "checkpointed at step" in x)
    return int(line.split("checkpointed at step ")[1].split(",")[0])


def test_persistent_pools_made_after_the_restore_point_shift_nothing(tmp_path: Path) -> None:
    """An evaluation loader's persistent pool, made in epoch 0 of the plain run, is made after
    the restore point in the resumed one: its base seed was one draw more from the global
    RNG, and every later shuffle differed. With the training loader's pool persistent too,
    the resumed process once held its pool past the script's end and never exited."""
    ref, _, resumed = lineage(
        tmp_path, "zc_pools.py", compat.StopAfter("out/log.txt", 12), "--train-workers", "2"
    )
    compat.assert_same(ref, resumed, streams=("stdout",))
    assert resumed.exit_lag < 10, f"the resumed job took {resumed.exit_lag:.1f} s to exit after its last line"


def test_a_resume_at_an_epochs_end_warns_of_nothing_the_plain_run_did_not(tmp_path: Path) -> None:
    """Resumed at an epoch's end, the script's `scheduler.step()` came before this process's
    first `optimizer.step()`, and torch warned "Detected call of `lr_scheduler.step()`
    before `optimizer.step()`", which the plain run never prints."""
    ref, stopped, resumed = lineage(
        tmp_path, "zc_epochs.py", compat.StopAfter("out/log.txt", 16), slow=("--sleep", "0.25")
    )
    assert checkpointed_step(stopped) == 16, stopped.ferry  # the epoch's last batch: 16 of 16
    compat.assert_same(ref, resumed)


def test_an_evaluation_over_the_training_loader_is_no_step_and_no_place_to_stop(tmp_path: Path) -> None:
    """Batches drawn by an evaluation pass over the training loader were counted as steps
    ("stopping at step 16" after 8 optimizer steps) and were safe points: a stop during
    that pass saved a position inside it, and the resumed run trained on its order. Now the
    stop waits for the next training batch, and the evaluation's own draws happen again."""
    ref, stopped, resumed = lineage(
        tmp_path,
        "zc_evaltrain.py",
        compat.StopAfter("out/log.txt", 8),  # epoch 0's 8 training steps: the evaluation is next
        slow=("--sleep", "0.05", "--eval-sleep", "0.2"),
    )
    step = checkpointed_step(stopped)
    assert 8 <= step <= 10, stopped.ferry  # optimizer steps, not batches drawn
    compat.assert_same(ref, resumed)
    assert resumed.stdout == ["trained 24 steps"]


def test_files_the_script_rewrites_before_the_restore_point_come_back(tmp_path: Path) -> None:
    """The resumed process runs the script from the top: `open("out/main.log", "w")`
    truncated the stopped run's log, and its banner and initial evaluation were written
    again. Now the log is as the plain run's, line for line."""
    ref, _, resumed = lineage(tmp_path, "zc_outfiles.py", compat.StopAfter("out/log.txt", 11))
    compat.assert_same(ref, resumed)
    assert ref.files["out/main.log"].startswith("config: epochs=3\ninitial loss")


def test_a_dataloader_worker_ending_never_touches_the_jobs_status(tmp_path: Path) -> None:
    """Forked DataLoader workers inherit threading's exit hooks: each worker, at its end
    (every epoch, without persistent workers), ran the session's exit hook, which wrote
    "finished" into the job's status while the job trained on."""
    home = tmp_path / "home"
    cmd = [compat.FERRY, "run", "--dir", str(tmp_path / "ck"), "--job-id", "w", "--", sys.executable]
    cmd += [
        str(SCRIPTS / "zc_epochs.py"),
        "--out",
        str(tmp_path / "out"),
        "--workers",
        "2",
        "--sleep",
        "0.05",
    ]
    proc = subprocess.Popen(cmd, env=compat.env_for(home), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    status, states = home / "jobs" / "w" / "status.json", []
    while proc.poll() is None:
        try:
            state = json.loads(status.read_text()).get("state")
        except (OSError, ValueError):
            state = None
        if state and (not states or states[-1] != state):
            states.append(state)
        time.sleep(0.02)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    assert states[-1] == "finished"
    assert "finished" not in states[:-1], states


def test_a_loop_in_a_library_is_said_before_the_first_save_and_at_the_resume(tmp_path: Path) -> None:
    """A loop that runs in a library's frames (an engine class in site-packages) is not
    captured: its counters restart on resume. ferry said "resumed ... at step 9" and nothing
    else; now it says which loop, before the first save and again at the resume."""
    lib = str(SCRIPTS / "lib" / "site-packages")
    argv = [sys.executable, str(SCRIPTS / "zc_libloop.py"), "--out", "out"]
    env = compat.env_for(tmp_path / "h", PYTHONPATH=lib)
    stopped = compat.under_ferry(
        [*argv, "--sleep", "0.1"], tmp_path / "run", env, stop=compat.StopAfter("out/log.txt", 5)
    )
    assert stopped.returncode == 85, "\n".join(stopped.log)
    said = [x for x in stopped.ferry if "runs in a library's code, enginelib/__init__.py" in x]
    first_save = next(i for i, x in enumerate(stopped.ferry) if "checkpoint step" in x)
    assert said and stopped.ferry.index(said[0]) < first_save, stopped.ferry
    assert "(in Engine.run)" in said[0]
    resumed = compat.under_ferry(argv, tmp_path / "run", env)
    assert resumed.returncode == 0, "\n".join(resumed.log)
    at_resume = [x for x in resumed.ferry if "the checkpoint was taken inside enginelib/__init__.py" in x]
    resumed_line = next(i for i, x in enumerate(resumed.ferry) if x.startswith("ferry: resumed from"))
    assert at_resume and resumed.ferry.index(at_resume[0]) < resumed_line, resumed.ferry


@pytest.mark.parametrize("chain", [False, True])
def test_a_handler_of_the_script_installed_over_ferrys_does_not_end_the_run_first(
    chain: bool, tmp_path: Path
) -> None:
    """A SIGTERM handler installed after ferry's that ends the loop at the batch's end (as
    Lightning's does, calling ferry's first) ended the run with exit 0 and no checkpoint.
    ferry now puts its handler back over it at the first safe point and stops first."""
    args = ("--chain",) if chain else ()
    ref, stopped, resumed = lineage(tmp_path, "zc_ownhandler.py", compat.StopAfter("out/log.txt", 10), *args)
    assert any("replaced ferry's SIGTERM handler" in x for x in stopped.ferry), stopped.ferry
    compat.assert_same(ref, resumed)
