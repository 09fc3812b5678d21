"""Zero-code mode on the idioms people write (docs/zero-code.md, "Idioms"): counters in
plain Python (a trainer's ``self.iter_num``, ``enumerate(loader)``, ``for step in
range(N)`` at module level) and scripts without a DataLoader (manual SGD, torch.optim).

Each script is stopped under `ferry run` inside an epoch, at an epoch boundary, or both
in one lineage (twice in a row), then run to its end; everything it printed across
the three runs, its final weights and its own per-epoch files must equal the plain
uninterrupted run. The stops are real SIGTERMs the script sends itself after a given step
(``ZC_STOP_AT``), so the step of each stop is exact on a busy machine too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reference import reference_run
from trainrun import SCRIPTS, env_for

pytestmark = pytest.mark.integration
FERRY = str(Path(sys.executable).parent / "ferry")

IDIOMS = [
    # (id, script, args, stops: after which step (the script's own count) to stop, resumed steps)
    ("trainer-iter-num-next", "zc_trainer.py", (), "4", [5]),
    ("enumerate-loader-break", "zc_enumerate.py", (), "102,204", [3, 10]),
    # with `ferry.track(history=history)`, the one line that captures a list the loop appends to
    ("module-level-range-next-tracked-list", "zc_range.py", (), "6,9", [7, 10]),
    ("no-loader-manual-sgd", "zc_lm.py", (), "4,20", [4, 20]),
    ("no-loader-torch-optim", "zc_lm.py", ("--optim",), "4", [5]),
]


@pytest.mark.parametrize(
    ("script", "args", "stops", "resumed"), [i[1:] for i in IDIOMS], ids=[i[0] for i in IDIOMS]
)
def test_idiom_resumes_as_the_plain_run(
    script: str,
    args: tuple[str, ...],
    stops: str,
    resumed: list[int],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    ref = reference_run(tmp_path_factory, script, args)
    out = tmp_path / "run"
    cmd = [FERRY, "run", "--dir", str(tmp_path / "ck"), "--job-id", "zc", "--"]
    cmd += [sys.executable, str(SCRIPTS / script), "--out", str(out), *args]
    env = env_for(tmp_path / "home", ZC_STOP_AT=stops, ZC_TRACK="1")
    printed, codes, errors = "", [], ""
    for _ in range(len(resumed) + 1):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        printed, errors = printed + proc.stdout, errors + proc.stderr
        codes.append(proc.returncode)
    assert codes == [85] * len(resumed) + [0], errors
    assert [
        int(line.split()[6]) for line in errors.splitlines() if line.startswith("ferry: resumed from")
    ] == resumed
    assert "warning" not in errors, errors  # nothing it could not capture, nothing left unrestored
    assert printed == (ref.parent / "stdout.txt").read_text()
    assert (out / "params.txt").read_text() == (ref / "params.txt").read_text()
    for saved in sorted(ref.glob("model-epoch*.pt")):  # the script's own files, each epoch
        mine, theirs = torch.load(out / saved.name), torch.load(saved)
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs), saved.name
