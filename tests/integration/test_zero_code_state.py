"""Zero-code mode keeps the loop's state wherever the user's code keeps it: in a trainer of
the user's own package (not under the script's folder), in a data loader the script wrote
itself (its current shard's token array included), in a list ``main()`` appends to, in a
loop whose function has a closure over its arguments (docs/zero-code.md, "What it
captures").

Each script is stopped under `ferry run` (SIGTERMs it sends itself after the steps in
``ZC_STOP_AT``) and run to its end; everything it printed across the runs and its final
weights must equal the plain uninterrupted run, with no warning from ferry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reference import reference_run
from trainrun import SCRIPTS, env_for

pytestmark = pytest.mark.integration
FERRY = str(Path(sys.executable).parent / "ferry")


def lineage(tmp: Path, script: str, args: list[str], stops: str) -> tuple[str, str, list[int]]:
    """Run ``script`` under `ferry run` until it finishes; what it printed, what ferry said,
    the exit codes."""
    cmd = [FERRY, "run", "--dir", str(tmp / "ck"), "--job-id", "zcs", "--"]
    cmd += [sys.executable, str(SCRIPTS / script), "--out", str(tmp / "run"), *args]
    env = env_for(tmp / "home", ZC_STOP_AT=stops)
    printed, said, codes = "", "", []
    for _ in range(3):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        printed, said = printed + proc.stdout, said + proc.stderr
        codes.append(proc.returncode)
        if proc.returncode != 85:
            break
    return printed, said, codes


def test_a_trainer_in_the_user_s_own_package_resumes_exactly(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`projects/x/train.py` drives `mypkg.trainer.Trainer` (two folders up, on sys.path):
    its `self.iter_num` is captured, so the resumed job trains the plain run's number of
    steps, not `max_iters` more."""
    script, args = "ownpkg/projects/x/train.py", ["--lib", str(SCRIPTS / "ownpkg")]
    ref = reference_run(tmp_path_factory, script, tuple(args))
    printed, said, codes = lineage(tmp_path, script, args, "5")
    assert codes == [85, 0], said
    assert "warning" not in said, said
    assert printed == (ref.parent / "stdout.txt").read_text()
    assert (tmp_path / "run" / "params.txt").read_text() == (ref / "params.txt").read_text()


def test_a_script_s_own_token_loader_its_results_list_and_a_closure_resume_exactly(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A GPT-2-style `DataLoaderLite` (no torch.utils.data) stopped twice in its second
    shard: its `tokens` (20 MiB, changed by training) are kept, so the resumed loader reads
    the second shard, not the first; `results` in main() comes back whole; the `for step in
    range(...)` of a function whose closure reads its `args` keeps its position, with no
    warning about loops over functions or dicts."""
    ref = reference_run(tmp_path_factory, "zc_shards.py", ())
    printed, said, codes = lineage(tmp_path, "zc_shards.py", [], "0,1")
    assert codes == [85, 85, 0], said
    assert "warning" not in said, said
    assert printed == (ref.parent / "stdout.txt").read_text()
    assert (tmp_path / "run" / "params.txt").read_text() == (ref / "params.txt").read_text()
