"""Zero-code frame state as untrusted input: a seeded mutation fuzzer (fuzz_frames.py)
checkpoints a real script under the real hooks, then resumes it with that checkpoint's
frame state mutated: most mutations at the real restore point of forked resumers (the real
parser, the real restore, the real live frames), a few script edits, and a few crafted
checkpoints through real `ferry run` processes. Every outcome must be a clean resume, a
ferry warning with a correct partial resume, or a one-line ferry error: no traceback, no
code run (a canary), no value written against the rules or silently left unrestored.

The seed is fixed (``FERRY_FUZZ_SEED`` picks another) so a failure reproduces; the counts
are printed at the end (``pytest -s``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ferry.autotrack import BOOT_DIR, stack

from trainrun import SCRIPTS, env_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not stack.supported() or sys.version_info >= (3, 13),
        reason="the fuzzer puts frames back through PyFrame_LocalsToFast (CPython 3.11, 3.12)",
    ),
]
HERE = Path(__file__).parent
COUNT = int(os.environ.get("FERRY_FRAME_FUZZ_COUNT", "1000"))
SEED = int(os.environ.get("FERRY_FUZZ_SEED", "27"))


def test_mutated_frame_state_resumes_warns_or_fails_cleanly(tmp_path: Path) -> None:
    lib = tmp_path / "lib" / "site-packages"  # the fuzzer's own frames are library frames
    lib.mkdir(parents=True)
    for name in ("fuzz_frames.py", "fuzz_frames_live.py", "fuzz_frames_mutations.py", "fuzz_child.py"):
        shutil.copy(HERE / name, lib / name)
    env = env_for(tmp_path / "home", FERRY_AUTOTRACK="1", PYTHONPATH=BOOT_DIR)
    proc = subprocess.run(
        [sys.executable, str(lib / "fuzz_frames.py"), str(tmp_path / "work"), str(SEED), str(COUNT),
         str(SCRIPTS / "zc_fuzzed.py")],
        capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    failures = summary.pop("failures")
    print(f"\nframe-state fuzzer: {json.dumps(summary, indent=1)}")
    for f in failures[:30]:
        print(f"FAILURE {f}")
    assert not failures, f"{len(failures)} bad outcomes, first: {failures[0]}"
    assert summary["mutations"] >= COUNT and set(summary["kinds"]) == set(summary["planned_kinds"])
    assert summary["edits"] == 3 and summary["full_runs"] == 2
    outcomes = summary["outcomes"]
    assert outcomes.get("refused", 0) > COUNT // 5 and outcomes.get("warned", 0) > COUNT // 5
    assert outcomes.get("clean", 0) >= summary["kinds"]["none"]
