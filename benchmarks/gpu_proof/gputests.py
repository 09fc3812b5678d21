"""gpu_proof.sh, the tests part: ``pytest tests/gpu``, one summary row per test (its outcome,
and a failure's or skip's first line). Under gVisor a process-level test that fails on a
driver call is UNAVAILABLE, not a pass and not ferry's failure.

    python gputests.py WORK [--timeout 300]   (from the repository's root)
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from common import plan, row, say

PART = "tests/gpu"
WHOLE = "pytest tests/gpu"
DRIVER_WORDS = ("CUDA_ERROR", "cuCheckpointProcess", "process checkpoint is not")


def outcome(case: ET.Element, gvisor: bool) -> tuple[str, str]:
    """(status, note) of one junit ``testcase``."""
    for tag, status in (("failure", "FAIL"), ("error", "FAIL"), ("skipped", "SKIPPED")):
        child = case.find(tag)
        if child is not None:
            text = child.get("message") or (child.text or "").strip()
            note = text.strip().splitlines()[0][:300] if text.strip() else tag
            process = "test_process_gpu" in (case.get("classname") or "")
            if (
                status == "FAIL"
                and gvisor
                and process
                and any(w in (child.text or text) for w in DRIVER_WORDS)
            ):
                return "UNAVAILABLE", f"gVisor: {note}"
            return status, note
    return "PASS", ""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work")
    p.add_argument("--gvisor", action="store_true")
    args = p.parse_args()
    plan(PART, [WHOLE])
    if importlib.util.find_spec("pytest") is None:
        row(
            PART,
            WHOLE,
            "-",
            "every test passes",
            "SKIPPED",
            f"pytest is not installed for {sys.executable}: carry its wheels in .whl/ (gpu_proof.sh)",
        )
        return 0
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    junit = work / "gpu-tests.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-v",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        f"--basetemp={work / 'pytest'}",
        f"--junitxml={junit}",
        "tests/gpu",
    ]
    say("$ " + " ".join(cmd))
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    print(proc.stdout[-20000:], proc.stderr[-5000:], sep="\n", file=sys.stderr)
    say(f"pytest exit {proc.returncode} in {time.monotonic() - t0:.1f} s")
    if not junit.exists():
        row(
            PART,
            WHOLE,
            f"exit {proc.returncode}, no report",
            "every test passes",
            "FAIL",
            (proc.stdout + proc.stderr).strip()[-300:],
        )
        return 0
    seen = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        status, note = outcome(case, args.gvisor)
        seen.append(status)
        name = f"{(case.get('classname') or '').rsplit('.', 1)[-1]}::{case.get('name')}"
        row(PART, name, f"{float(case.get('time') or 0):.1f} s", "passes", status, note)
    counts = ", ".join(f"{seen.count(s)} {s}" for s in ("PASS", "FAIL", "UNAVAILABLE", "SKIPPED"))
    row(PART, WHOLE, f"exit {proc.returncode}: {counts}", "every test passes", whole(seen))
    return 0


def whole(seen: list[str]) -> str:
    """The row of the whole run: FAIL if any failed, else UNAVAILABLE if any was, else PASS if any passed."""
    for status in ("FAIL", "UNAVAILABLE", "PASS"):
        if status in seen:
            return status
    return "SKIPPED"


if __name__ == "__main__":
    raise SystemExit(main())
