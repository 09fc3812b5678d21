"""Issue 19: after a resume, the script's own ``torch.save`` files are the uninterrupted
run's files. Restored tensors that were views of one shared load buffer made them larger
(``torch.save`` writes a tensor's whole storage), with the same values."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainrun import env_for, run

pytestmark = pytest.mark.integration
EXIT_CHECKPOINTED = 85
SCRIPT = "train_then_torch_save.py"
FILES = ("optimizer.pt", "model.pt", "scheduler.pt", "tensor.pt")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run's files."""
    tmp = tmp_path_factory.mktemp("reference")
    ref = run(SCRIPT, tmp / "ref", [], env_for(tmp / "home", FERRY_DIR=str(tmp / "ck")))
    assert ref.returncode == 0, ref.stderr
    return tmp / "ref"


@pytest.mark.parametrize("signal_at", [5, 12])  # mid first epoch; mid second, after a sched step
def test_resumed_run_torch_saves_the_same_files(tmp_path: Path, reference: Path, signal_at: int) -> None:
    env = env_for(tmp_path / "home", FERRY_DIR=str(tmp_path / "ck"))
    first = run(SCRIPT, tmp_path / "run", ["--signal-at", str(signal_at)], env)
    assert first.returncode == EXIT_CHECKPOINTED, first.stderr
    second = run(SCRIPT, tmp_path / "run", [], env)
    assert second.returncode == 0, second.stderr
    assert "ferry: resumed from" in second.stderr

    sizes = {name: ((reference / name).stat().st_size, (tmp_path / "run" / name).stat().st_size)
             for name in FILES}  # fmt: skip
    assert all(a == b for a, b in sizes.values()), f"uninterrupted vs resumed file sizes: {sizes}"
    for name in FILES:
        assert (reference / name).read_bytes() == (tmp_path / "run" / name).read_bytes(), name
