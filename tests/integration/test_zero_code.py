"""Zero-code mode: unmodified scripts (they never import ferry) run under `ferry run`, are
interrupted by a signal to the supervisor, resumed by `ferry run` again, and must match
the uninterrupted plain-python run bit for bit."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainrun import SCRIPTS, env_for

pytestmark = pytest.mark.integration
FERRY = str(Path(sys.executable).parent / "ferry")


def plain(script: str, out: Path, args: list[str], home: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / script), "--out", str(out), *args],
        env=env_for(home),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr


def under_ferry(
    script: str,
    out: Path,
    args: list[str],
    tmp: Path,
    *,
    stop_after_lines: int = 0,
) -> subprocess.CompletedProcess[str]:
    cmd = [
        FERRY,
        "run",
        "--dir",
        str(tmp / "ck"),
        "--job-id",
        "zc",
        "--",
        sys.executable,
        str(SCRIPTS / script),
        "--out",
        str(out),
        *args,
    ]
    proc = subprocess.Popen(
        cmd, env=env_for(tmp / "home"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if stop_after_lines:
        log = out / "log.txt"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if log.exists() and log.read_text().count("\n") >= stop_after_lines:
                proc.send_signal(signal.SIGUSR1)
                break
            time.sleep(0.02)
    stdout, stderr = proc.communicate(timeout=180)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def training_record(out: Path) -> tuple[dict[str, str], str]:
    """Per-step lines (the last one written for each step) and the final parameters.
    Evaluation lines are left out: in the resumed run, epochs the checkpoint covers are
    fast-forwarded and their evaluation loops see no data (documented in docs/zero-code.md)."""
    steps: dict[str, str] = {}
    for line in (out / "log.txt").read_text().splitlines():
        key = line.split(" ", 1)[0]
        if key.isdigit():
            steps[key] = line
    return steps, (out / "params.txt").read_text()


CASES = [
    ("epochs-train-test-steplr", "zc_epochs.py", [], 30),
    ("epochs-workers2", "zc_epochs.py", ["--workers", "2"], 40),
    ("step-budget-iter-next", "zc_steps.py", [], 25),
    ("torch-compile", "zc_steps.py", ["--compile"], 25),
    ("amp-grad-scaler", "zc_steps.py", ["--amp"], 25),
]


@pytest.mark.parametrize(("case", "script", "args", "stop_after"), CASES, ids=[c[0] for c in CASES])
def test_unmodified_script_resumes_bitwise(
    case: str, script: str, args: list[str], stop_after: int, tmp_path: Path
) -> None:
    plain(script, tmp_path / "ref", args, tmp_path / "home-ref")
    first = under_ferry(
        script, tmp_path / "run", [*args, "--sleep", "0.03"], tmp_path, stop_after_lines=stop_after
    )
    assert first.returncode == 85, first.stderr
    assert "checkpointed at step" in first.stderr
    second = under_ferry(script, tmp_path / "run", args, tmp_path)
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stderr
    ref_steps, ref_params = training_record(tmp_path / "ref")
    run_steps, run_params = training_record(tmp_path / "run")
    assert run_steps == ref_steps
    assert run_params == ref_params


def test_untracked_global_generator_is_reported(tmp_path: Path) -> None:
    proc = under_ferry("zc_steps.py", tmp_path / "run", ["--numpy-generator", "--steps", "12"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "global RNG (a numpy Generator) is not captured" in proc.stderr


def test_existing_sitecustomize_keeps_working(tmp_path: Path) -> None:
    """ferry's start-up hook goes first on PYTHONPATH and chains to the user's own."""
    user_site = tmp_path / "site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    probe = "import os, sys; print(os.environ.get('USER_SITE_RAN'), 'ferry.autotrack.hooks' in sys.modules)"
    env = env_for(tmp_path / "home", PYTHONPATH=str(user_site))
    proc = subprocess.run(
        [FERRY, "run", "--dir", str(tmp_path / "ck"), "--", sys.executable, "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["yes", "True"]
