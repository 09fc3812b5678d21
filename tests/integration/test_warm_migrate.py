"""Issue 20: warm migration. One job's lineage chains the scenarios: two warm migrations in
a row (periodic saves running, every 3 steps), then a warm worker SIGKILLed during the
overlap (the migration fails in one line, the old worker trains on), then the job stopped
during the overlap (the warm worker is discarded, the old one checkpoints and stops), then
the job moved to a second job folder with `ferry resume --warm` (its worker waits at its
restore point until `ferry export` wrote the bundle) and run to its end: bitwise equal to
the uninterrupted run. The warm workers' setup line is printed only by those that took
over, after the take-over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ferry.errors import JobError
from ferry.runtime.jobdir import JobDir

from reference import reference_run
from test_cli_jobs import FERRY, ferry, start, status, training, wait_for
from trainrun import SCRIPTS, assert_same, env_for

pytestmark = pytest.mark.integration
EXIT_CHECKPOINTED = 85
EPOCHS = ("--epochs", "10")  # 120 steps
CRAWL_FROM = 72
"""While the test holds the job (``slow``), its steps take 0.2 s up to this one, then up to 3 s
each (a step ends as soon as ``slow`` goes): 14 s, then 144 s more before the job could end
under the test. The test needs about 22 s (the job at step 66 when it stops it, on a loaded
2-core host), so an idle host never reaches the slow steps; a loaded one has room for its
warm workers' slow start-ups (a job of 24 s in all once ended before a migration request)."""


def command(tmp: Path) -> list[str]:
    return [sys.executable, str(SCRIPTS / "launcher_wrap.py"), "--say", "setup done",
            "--hold-warm", str(tmp / "hold-warm"), "--record-env", f"CUDA_VISIBLE_DEVICES={tmp / 'seen'}",
            "--out", str(tmp / "run"), *EPOCHS, "--sleep", "0.2",
            "--sleep-while", str(tmp / "slow"), "--crawl-from", str(CRAWL_FROM)]  # fmt: skip


def events(path: Path, kind: str, since: float = 0.0) -> list[dict[str, object]]:
    return [dict(e) for e in JobDir(str(path)).events() if e["event"] == kind and e["time"] >= since]


def warm_started(path: Path, since: float, proc: subprocess.Popen[str]) -> int:
    wait_for("a warm worker to start", lambda: events(path, "warm_start", since), proc)
    pid = events(path, "warm_start", since)[-1]["pid"]
    assert isinstance(pid, int)
    return pid


def migrate_in_background(home: Path, to: str) -> subprocess.Popen[str]:
    argv = [*FERRY, "migrate", "w", "--to", to, "--unchecked-devices", "--timeout", "60"]
    pipe = subprocess.PIPE
    return subprocess.Popen(argv, env=env_for(home), stdout=pipe, stderr=pipe, text=True)


def test_warm_moves_then_a_kill_and_a_stop_during_the_overlap_bitwise(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    reference = reference_run(tmp_path_factory, args=EPOCHS)
    home, path = tmp_path / "home", tmp_path / "home" / "jobs" / "w"
    (tmp_path / "slow").touch()  # training steps take 0.2 s (3 s past CRAWL_FROM) until the test is done
    proc = start(home, "w", tmp_path / "ck", command(tmp_path), "--max-restarts", "3", "--every-steps", "3",
                 "--env", "CUDA_VISIBLE_DEVICES=0")  # fmt: skip
    wait_for("training to reach step 3", training(path), proc)
    first = status(path)["worker_pid"]

    # two warm migrations in a row, with a periodic save due every third step
    pids = [first]
    for to in ("1", "0"):
        moved = ferry(home, "migrate", "w", "--to", to, "--unchecked-devices", "--timeout", "60", "--json")
        assert moved.exit_code == 0, moved.output
        doc = json.loads(moved.stdout)
        assert doc["warm"] and doc["cold_reason"] is None and doc["target"] == to, (doc, moved.stderr)
        parts = [doc[k] for k in ("drain", "handover", "restore", "first_step")]
        assert all(p >= 0 for p in parts) and doc["downtime"] == pytest.approx(sum(parts))
        assert doc["handover"] >= doc["save"] > 0 and doc["restart"] == 0
        assert doc["pid"] not in pids and status(path)["worker_pid"] == doc["pid"]
        (restart,) = [e for e in events(path, "restart") if e["pid"] == doc["pid"]]
        assert restart["warm"] is True
        pids.append(doc["pid"])
    assert (tmp_path / "seen").read_text().split() == ["0", "1", "0"]

    # SIGKILL the warm worker during the overlap: the migration fails, the job trains on
    (tmp_path / "hold-warm").touch()  # warm workers wait in their setup until the file goes
    t = time.time()
    mig = migrate_in_background(home, "1")
    warm = warm_started(path, t, proc)
    os.kill(warm, signal.SIGKILL)
    _, err = mig.communicate(timeout=60)
    assert mig.returncode == JobError.exit_code, err
    (line,) = err.strip().splitlines()[-1:]
    assert "killed by SIGKILL" in line and "trains on unchanged" in line and "Traceback" not in err
    step = status(path)["step"]
    wait_for("the old worker to train on", training(path, step + 2), proc)
    assert status(path)["worker_pid"] == pids[-1]

    # stop the job during the overlap: the warm worker is discarded, the old one checkpoints
    t = time.time()
    mig = migrate_in_background(home, "1")
    warm = warm_started(path, t, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_CHECKPOINTED, err
    assert mig.wait(timeout=60) != 0
    with pytest.raises(ProcessLookupError):
        os.kill(warm, 0)
    (discarded,) = [e for e in events(path, "warm_discarded", t)]
    assert discarded["pid"] == warm and "stopping" in str(discarded["reason"])
    (stop,) = events(path, "stop", t)
    assert status(path)["state"] == "checkpointed" and status(path)["step"] == stop["step"]
    # only the workers that trained printed their setup line (buffered ones were dropped)
    assert out.split("\n").count("setup done") == 3
    assert (tmp_path / "seen").read_text().split() == ["0", "1", "0"]

    # the job moves to another node (a second job folder here): `ferry resume --warm` starts its
    # worker before the bundle exists; `ferry export` writes it; the worker takes over
    (tmp_path / "slow").unlink()
    (tmp_path / "hold-warm").unlink()
    bundle, path_b = tmp_path / "bundle", home / "jobs" / "w2"
    node_b = subprocess.Popen(
        [*FERRY, "resume", "--warm", str(bundle), "--job-id", "w2", "--dir", str(tmp_path / "ck2"),
         "--gpus", "1", "--no-autotrack", "--", *command(tmp_path)],
        env=env_for(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        wait_for(
            "the new node's worker to wait at its restore point", lambda: events(path_b, "warm_ready"), node_b
        )
        assert status(path_b)["state"] == "starting" and not list((tmp_path / "ck2").glob("step-*"))
        exported = ferry(home, "export", "w", str(bundle), "--timeout", "60")
        assert exported.exit_code == 0, exported.output
        out, err = node_b.communicate(timeout=120)
        assert node_b.returncode == 0, err
        assert "took over at step" in err and "downtime" in err and "Traceback" not in err
        assert out.split("\n").count("setup done") == 1
        assert [e["step"] for e in events(path_b, "resume")] == [stop["step"]]
        assert (tmp_path / "seen").read_text().split() == ["0", "1", "0", "1"]
    finally:
        if node_b.poll() is None:  # a failed test leaves no supervisor waiting for a bundle
            node_b.kill()
            node_b.communicate()
    assert_same(reference, tmp_path / "run")
