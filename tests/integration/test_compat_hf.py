"""Do no harm, for the Hugging Face Trainer (transformers 5.23, accelerate 1.15): a
run_clm.py-style job (scripts/hf_clm.py) run to its end under `ferry run`, where zero-code
mode adds its callback to the Trainer and hooks ``Trainer.__init__``/``train``, prints the
same lines, writes the same files bit for bit (the Trainer's checkpoint folders, its
``trainer_state.json``, the model and the optimizer, and what ``inspect`` says of the two
hooked methods) and exits as plain ``python`` does:
on one process with ``enable_jit_checkpoint`` (whose SIGTERM handler ferry takes back),
and under ``torchrun --nproc_per_node 2`` on gloo."""

from __future__ import annotations

from pathlib import Path

import pytest

import compat
import hfjobs

pytestmark = pytest.mark.integration
pytest.importorskip("transformers")


@pytest.mark.parametrize("torchrun", [False, True], ids=["one-process", "torchrun-2-ranks"])
def test_an_uninterrupted_run_is_the_plain_run(
    torchrun: bool, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    command = hfjobs.argv(*(() if torchrun else hfjobs.JIT), torchrun=torchrun)
    ref = hfjobs.reference(tmp_path_factory, command)
    got = compat.under_ferry(command, tmp_path / "run", hfjobs.env(tmp_path / "home"), scrub=hfjobs.scrub)
    compat.assert_same(ref, got)
    assert got.exit_lag < 10, f"the job exited {got.exit_lag:.1f} s after its last line"
