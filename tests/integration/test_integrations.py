"""Issue: integrations. For Lightning, Keras 3 (torch backend) and the Hugging Face Trainer,
a real CPU training run is interrupted by SIGTERM mid-epoch, exits 85 after ferry's
checkpoint, resumes in a fresh process and must end with the same bits as the
uninterrupted run: every parameter and optimizer buffer (Lightning and HF with dropout,
so the random state must come back at the right point too). One subprocess per run: the
libraries import slowly, and each run must start from a fresh interpreter anyway."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from trainrun import env_for, run

pytestmark = pytest.mark.integration
EXIT_CHECKPOINTED = 85

# (script, module it needs, step to interrupt at: mid-epoch, 12 steps an epoch)
CASES = [
    ("int_lightning.py", "lightning", 17),
    ("int_transformers.py", "transformers", 17),
]


def _params(out: Path) -> str:
    return (out / "params.txt").read_text()


@pytest.mark.parametrize(("script", "module", "at"), CASES, ids=[c[1] for c in CASES])
def test_interrupted_fit_resumes_bitwise(script: str, module: str, at: int, tmp_path: Path) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed: pip install 'gpuferry[{module}]'")
    extra = {"KERAS_BACKEND": "torch"}
    fresh = run(
        script, tmp_path / "ref", [], env_for(tmp_path / "h1", FERRY_DIR=str(tmp_path / "ck1"), **extra)
    )
    assert fresh.returncode == 0, fresh.stderr[-3000:]

    env = env_for(tmp_path / "h2", FERRY_DIR=str(tmp_path / "ck2"), **extra)
    stopped = run(script, tmp_path / "res", ["--signal-at", str(at)], env)
    assert stopped.returncode == EXIT_CHECKPOINTED, stopped.stderr[-3000:]
    assert f"checkpointed at step {at}" in stopped.stderr
    assert not (tmp_path / "res" / "params.txt").exists()

    resumed = run(script, tmp_path / "res", [], env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and f"at step {at}" in resumed.stderr
    assert _params(tmp_path / "ref") == _params(tmp_path / "res"), (
        f"{module}: the resumed run's weights differ"
    )


def test_lightning_slurm_requeue_has_one_owner(tmp_path: Path) -> None:
    """Lightning's SLURM auto-requeue left on beside ferry is refused, with the fix named."""
    if importlib.util.find_spec("lightning") is None:
        pytest.skip("lightning is not installed: pip install 'gpuferry[lightning]'")
    env = env_for(tmp_path / "h", FERRY_DIR=str(tmp_path / "ck"), SLURM_JOB_ID="1", SLURM_NTASKS="1")
    proc = run("int_lightning.py", tmp_path / "out", ["--slurm-auto-requeue"], env)
    assert proc.returncode not in (0, EXIT_CHECKPOINTED)
    assert "SLURMEnvironment(auto_requeue=False)" in proc.stderr


def test_importing_ferry_imports_no_trainer_library() -> None:
    code = (
        "import sys, ferry, ferry.integrations\n"
        "bad = [m for m in ('lightning', 'pytorch_lightning', 'transformers', 'keras') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
