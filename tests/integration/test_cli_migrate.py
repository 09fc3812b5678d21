"""Issue: ``ferry migrate``, ``export``, ``resume`` and ``report`` on real jobs: a migration
restarts the worker on the target devices (the restarted worker sees the new
CUDA_VISIBLE_DEVICES) and resumes at the saved step; an export leaves a bundle that
``ferry resume`` starts as a new job. The final parameters equal an uninterrupted run's."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ferry.engine import list_checkpoints, verify
from ferry.ops.bundle import copy_checkpoint, prepare_resume
from ferry.runtime.jobdir import JobDir
from ferry.storage import open_storage

from test_cli_jobs import FERRY, ferry, start, status, training, wait_for
from trainrun import SCRIPTS, assert_same, env_for

pytestmark = pytest.mark.integration
EXIT_CHECKPOINTED = 85


def recording(seen: Path, out: Path) -> list[str]:
    """train_explicit.py that first appends its CUDA_VISIBLE_DEVICES to ``seen``."""
    wrap = SCRIPTS / "launcher_wrap.py"
    return [sys.executable, str(wrap), "--record-env", f"CUDA_VISIBLE_DEVICES={seen}",
            "--out", str(out), "--sleep", "0.08"]  # fmt: skip


def test_migrate_moves_the_worker_and_stays_bitwise(tmp_path: Path, reference: Path) -> None:
    home, out, seen = tmp_path / "home", tmp_path / "run", tmp_path / "seen.txt"
    path = home / "jobs" / "m"
    proc = start(home, "m", tmp_path / "ck", recording(seen, out), "--max-restarts", "1",
                 "--env", "CUDA_VISIBLE_DEVICES=0")  # fmt: skip
    wait_for("training to reach step 3", training(path), proc)
    first = status(path)["worker_pid"]

    moved = ferry(home, "migrate", "m", "--to", "1", "--unchecked-devices", "--cold", "--timeout", "60",
                  "--json")  # fmt: skip
    assert moved.exit_code == 0, moved.output
    doc = json.loads(moved.stdout)
    assert doc["source"] == "0" and doc["target"] == "1" and doc["pid"] != first
    parts = [doc[k] for k in ("drain", "save", "restart", "restore")]
    assert all(p >= 0 for p in parts) and doc["downtime"] == pytest.approx(sum(parts))
    assert doc["save"] > 0 and doc["restart"] > 0
    resumes = [e for e in JobDir(str(path)).events() if e["event"] == "resume"]
    assert [e["step"] for e in resumes] == [doc["step"]]  # it resumed at the saved step
    live = json.loads(ferry(home, "status", "m", "--json").stdout)
    assert live["pid"] == doc["pid"] and live["devices"] in ("1", None)  # None: it finished already

    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert seen.read_text().split() == ["0", "1"]  # the restarted worker got the new devices
    assert_same(reference, out)

    report = ferry(home, "report", "m", "-o", str(tmp_path / "m.html"), "--json")
    assert report.exit_code == 0, report.output
    summary = json.loads(report.stdout)
    assert [m["kind"] for m in summary["marks"]] == ["migration"]  # its stop and restart: one mark
    page = (tmp_path / "m.html").read_text()
    assert "<svg" in page and "CUDA_VISIBLE_DEVICES=1" in page and "<script" not in page
    png = (tmp_path / "m.png").read_bytes()  # drawn by matplotlib (tests/integration/test_report.py)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 800 and height >= 400 and len(png) > 10_000


def test_export_then_resume_into_a_new_job_bitwise(tmp_path: Path, reference: Path) -> None:
    home, out, seen = tmp_path / "home", tmp_path / "run", tmp_path / "seen.txt"
    path = home / "jobs" / "e"
    proc = start(home, "e", tmp_path / "ck", recording(seen, out), "--env", "CUDA_VISIBLE_DEVICES=0",
                 "--every-steps", "5")  # fmt: skip
    wait_for("training to reach step 7", training(path, 7), proc)

    dest = tmp_path / "bundle dir 'quoted'"
    exported = ferry(home, "export", "e", str(dest), "--timeout", "60", "--json")
    assert exported.exit_code == 0, exported.output
    proc.communicate(timeout=60)
    assert proc.returncode == EXIT_CHECKPOINTED
    bundle = json.loads((dest / "bundle.json").read_text())
    assert bundle["command"] == recording(seen, out) and bundle["cwd"]
    assert bundle["env"]["CUDA_VISIBLE_DEVICES"] == "0" and bundle["env"]["FERRY_EVERY_STEPS"] == "5"
    assert "PYTHONPATH" not in bundle["env"] or "autotrack" not in bundle["env"]["PYTHONPATH"]
    name = bundle["checkpoint"].rsplit("/", 1)[-1]
    assert (dest / bundle["checkpoint"] / "manifest.json").is_file() and name == f"step-{bundle['step']:012d}"
    assert bundle["torch_version"] and bundle["step"] == JobDir(str(path)).status()["step"]
    remote = f"memory://ferry-cli-{os.getpid()}/bundle"  # a bundle on an fsspec store resumes too
    copy_checkpoint(str(dest / bundle["checkpoint"]), open_storage(f"{remote}/checkpoints"), print)
    open_storage(remote).write_bytes("bundle.json", (dest / "bundle.json").read_bytes())
    argv, env, _, _ = prepare_resume(remote, str(tmp_path / "ck3"), [], "1", print)
    assert argv == bundle["command"] and env["CUDA_VISIBLE_DEVICES"] == "1"
    copied = open_storage(str(tmp_path / "ck3"))
    assert [r.step for r in list_checkpoints(copied)] == [bundle["step"]]
    assert verify(copied, name)["step"] == bundle["step"]
    again = ferry(home, "export", "e", str(dest))
    assert again.exit_code == 2 and "already holds a bundle" in again.stderr

    resumed = subprocess.run(
        [*FERRY, "resume", str(dest), "--job-id", "e2", "--gpus", "1", "--dir", str(tmp_path / "ck2")],
        env=env_for(home), capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert seen.read_text().split() == ["0", "1"]
    new = JobDir(str(home / "jobs" / "e2"))
    assert new.status()["state"] == "finished" and new.identity()["checkpoint_dir"] == str(tmp_path / "ck2")
    (resume,) = [e for e in new.events() if e["event"] == "resume"]
    assert resume["step"] == bundle["step"] and resume["url"].startswith(str(tmp_path / "ck2"))
    assert_same(reference, out)
