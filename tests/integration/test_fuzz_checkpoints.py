"""Checkpoints as untrusted input: a seeded mutation fuzzer (fuzz_checkpoints.py) damages
and crafts thousands of copies of a saved rich state and reads each through ``ferry.load``,
``ferry verify`` and ``ferry inspect`` in forked workers under an address-space limit and
an alarm. Every outcome must be the state, bitwise, or a one-line ferry error.

The seed is fixed (``FERRY_FUZZ_SEED`` picks another) so a failure reproduces; the counts
are printed at the end (``pytest -s``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

DRIVER = Path(__file__).with_name("fuzz_checkpoints.py")
COUNT = int(os.environ.get("FERRY_FUZZ_COUNT", "2000"))
SEED = int(os.environ.get("FERRY_FUZZ_SEED", "13"))


def test_mutated_checkpoints_load_bitwise_or_fail_with_a_ferry_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(tmp_path), str(SEED), str(COUNT)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    failures = summary.pop("failures")
    print(f"\ncheckpoint fuzzer: {json.dumps(summary, indent=1)}")
    for f in failures[:30]:
        print(f"FAILURE {f}")
    assert summary["mutations"] >= COUNT
    assert set(summary["kinds"]) == set(summary["planned_kinds"])
    assert not failures, f"{len(failures)} bad outcomes, first: {failures[0]}"
    outcomes = summary["outcomes"]
    assert outcomes.get("load:equal", 0) >= summary["kinds"]["none"]  # the unmutated copies load
    assert outcomes.get("load:error", 0) > COUNT // 2
