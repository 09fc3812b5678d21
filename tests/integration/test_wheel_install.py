"""Issue 30: ferry as users get it. The wheel is built from this tree and installed into a
fresh venv (with pip, offline: its dependencies, torch included, are this environment's,
linked into a folder on the venv's path, exactly the closure of gpuferry's runtime
requirements and nothing of the extras); there, the ``ferry`` script, ``python -m ferry``
and ``ferry help`` (the docs shipped in the wheel) work, and a job under ``ferry run`` is
stopped by SIGTERM and resumed by the same command run again."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from importlib.metadata import Distribution, distribution
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from trainrun import REPO, SCRIPTS, env_for, wait_for
from trainrun import job_status as status

pytestmark = pytest.mark.integration
SKIP = shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.egg-info", ".*_cache", "build", "dist",
                              "demo-out", "ferry-checkpoints", "ferry-chaos")  # fmt: skip


def closure(name: str) -> list[Distribution]:
    """``name``'s installed distribution and those its runtime requirements need, recursively
    (no extras)."""
    seen: dict[str, Distribution] = {}
    todo = [name]
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in seen:
            continue
        seen[key] = dist = distribution(key)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def link_dependencies(into: Path) -> None:
    """Every file and folder of gpuferry's dependencies (not of gpuferry), linked into ``into``."""
    site = Path(sysconfig.get_paths()["purelib"])
    for dist in closure("gpuferry"):
        if dist.metadata["Name"] == "gpuferry":
            continue
        for top in {Path(str(f)).parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            if (site / top).exists() and not (into / top).exists():
                (into / top).symlink_to(site / top)


def run(*argv: object, **options: Any) -> subprocess.CompletedProcess[str]:
    """A command to its end, its output kept; it must succeed."""
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300, **options)
    assert done.returncode == 0, done.stderr
    return done


def test_the_wheel_installs_runs_and_resumes(tmp_path: Path) -> None:
    source, dist, venv, deps = tmp_path / "src", tmp_path / "dist", tmp_path / "venv", tmp_path / "deps"
    shutil.copytree(REPO, source, symlinks=True, ignore=SKIP)
    pip = [sys.executable, "-m", "pip"]
    run(*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, source)
    (wheel,) = dist.glob("gpuferry-*.whl")

    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    deps.mkdir()
    link_dependencies(deps)
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    Path(purelib, "dependencies.pth").write_text(f"{deps}\n")
    run(*pip, "--python", python, "install", "-q", "--no-index", wheel)  # offline: the deps are there

    env = {k: v for k, v in env_for(tmp_path / "home").items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    where = run(python, "-c", "import ferry; print(ferry.__file__)", env=env).stdout
    assert where.startswith(purelib), where  # the wheel's ferry, not this checkout's
    assert run(venv / "bin" / "ferry", "--version", env=env).stdout.startswith("ferry, version")
    assert run(python, "-m", "ferry", "help", "cli", env=env).stdout.startswith("# The operator CLI")

    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(SCRIPTS / "zc_epochs.py", work / "train.py")
    command = ["ferry", "run", "--", "python", "train.py", "--out", "out", "--epochs", "2", "--sleep", "0.05"]
    first = subprocess.Popen(
        command, cwd=work, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    home = tmp_path / "home" / "jobs"
    wait_for("the job directory", lambda: home.is_dir() and any(home.iterdir()), first, timeout=120)
    (job,) = home.iterdir()
    wait_for("training to reach step 5", lambda: status(job).get("step", 0) >= 5, first, timeout=120)
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 85, err
    again = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"resumed from {work}/ferry-checkpoints/{job.name}/step-" in again.stderr, again.stderr
