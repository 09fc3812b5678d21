"""gpu_proof.sh, the zero-code part: ``zc_gpu_train.py`` (a GPU script that never imports
ferry: AMP with GradScaler, torch.compile, dropout, deterministic algorithms) run three times:

1. plain ``python``, uninterrupted: the reference;
2. ``ferry run`` (zero-code), SIGTERM to ``ferry run`` once the script has logged
   ``--stop-at`` steps: must exit 85 with a committed checkpoint;
3. ``ferry run`` again, same ``--dir`` and ``--job-id``: must resume and exit 0;

then every line logged by 2 and 3 (each step's loss, bit for bit, and the scaler's scale)
and the final parameters and optimizer state must equal 1's; and

4. ``ferry run``, uninterrupted, in a fresh folder: must equal 1 too (do no harm: ferry's
   hooks leave the compiled graphs and their numbers alone). Where 3 differs from 1, 4 says
   whether the resume or the hooks made the difference.

    python zerocode.py WORK [--steps 200] [--stop-at 80] [--device cuda]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import DRY, SMALL, plan, row, say, verdict, why_no_cuda

PART = "zero-code"
CHECKS = (
    "ferry run (zero-code) of a GPU script, SIGTERM: checkpoint, exit 85",
    "ferry run again: resumes, exit 0",
    "resumed run bitwise the uninterrupted one (losses, scale, parameters, optimizer)",
    "uninterrupted ferry run bitwise the plain python run (do no harm)",
)
SCRIPT = str(Path(__file__).with_name("zc_gpu_train.py"))
FERRY = [sys.executable, "-c", "import sys; from ferry.cli import main; sys.argv[0] = 'ferry'; main()"]


def train_cmd(out: Path, args: argparse.Namespace, *extra: str) -> list[str]:
    backend = "eager" if args.device == "cpu" else "inductor"
    return [
        sys.executable,
        SCRIPT,
        "--out",
        str(out),
        "--steps",
        str(args.steps),
        "--device",
        args.device,
        "--backend",
        backend,
        *extra,
    ]


def under_ferry(ck: Path, cmd: list[str], stop_at: int = 0) -> tuple[int, str, float]:
    """``ferry run`` of ``cmd`` with its checkpoints in ``ck``; with ``stop_at``, SIGTERM to it
    once the log has that many lines. Returns (exit code, stderr, seconds from the signal to
    the exit)."""
    full = [*FERRY, "run", "--dir", str(ck), "--job-id", ck.name, "--", *cmd]
    say("$ " + " ".join(full))
    proc = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = Path(cmd[cmd.index("--out") + 1]) / "log.txt"
    signalled = 0.0
    if stop_at:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if log.exists() and log.read_text().count("\n") >= stop_at:
                proc.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                break
            time.sleep(0.01)
    _, err = proc.communicate(timeout=240)
    took = time.monotonic() - signalled if signalled else 0.0
    say(f"exit {proc.returncode}; stderr ends: {err.strip()[-600:]}")
    return proc.returncode, err, took


def record(out: Path) -> tuple[list[str], str]:
    log, params = out / "log.txt", out / "params.txt"
    return (
        log.read_text().splitlines() if log.exists() else [],
        params.read_text() if params.exists() else "(no params.txt)",
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work", help="a fresh folder for the runs' outputs, checkpoints and caches")
    p.add_argument("--steps", type=int, default=60 if SMALL else 200)
    p.add_argument("--stop-at", type=int, default=25 if SMALL else 80)
    p.add_argument("--device", default="cpu" if DRY else "cuda")
    args = p.parse_args()
    plan(PART, CHECKS)
    reason = why_no_cuda() if args.device == "cuda" else None
    if reason is not None:
        for check in CHECKS:
            row(PART, check, "-", "-", "SKIPPED", reason)
        return 0
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("FERRY_HOME", str(work / "home"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "inductor"))
    t0 = time.monotonic()
    plain = subprocess.run(train_cmd(work / "ref", args), capture_output=True, text=True, timeout=300)
    say(f"plain run: exit {plain.returncode} in {time.monotonic() - t0:.1f} s; {plain.stderr.strip()[-600:]}")
    if plain.returncode != 0:
        for check in CHECKS:
            row(
                PART,
                check,
                "-",
                "-",
                "FAIL",
                f"the plain run failed ({plain.returncode}): {plain.stderr[-300:]}",
            )
        return 0
    code, err, took = under_ferry(work / "ck", train_cmd(work / "run", args, "--sleep", "0.02"), args.stop_at)
    stopped = len(record(work / "run")[0])
    row(
        PART,
        CHECKS[0],
        f"exit {code} at step {stopped}, {took:.2f} s after SIGTERM",
        "85, checkpointed",
        verdict(code == 85 and "checkpointed at step" in err),
    )
    code, err, _ = under_ferry(work / "ck", train_cmd(work / "run", args))
    row(PART, CHECKS[1], f"exit {code}", "0, resumed", verdict(code == 0 and "resumed from" in err))
    compare(CHECKS[2], work / "ref", work / "run", args.steps)
    code, err, _ = under_ferry(work / "ck-whole", train_cmd(work / "whole", args))
    if code != 0:
        row(PART, CHECKS[3], f"exit {code}", "equal", "FAIL", err.strip()[-300:])
        return 0
    compare(CHECKS[3], work / "ref", work / "whole", args.steps)
    return 0


def compare(check: str, ref: Path, run: Path, steps: int) -> None:
    """A row: ``run``'s log and final state against ``ref``'s, bit for bit."""
    ref_log, ref_params = record(ref)
    run_log, run_params = record(run)
    first_diff = next((i for i, (a, b) in enumerate(zip(ref_log, run_log, strict=False)) if a != b), None)
    state = "equal" if run_params == ref_params else "DIFFER"
    figure = (
        f"{len(run_log)} steps (plain {len(ref_log)}), first differing: {first_diff}; final state {state}"
    )
    same = run_log == ref_log and run_params == ref_params and len(ref_log) == steps
    row(PART, check, figure, "equal", verdict(same))


if __name__ == "__main__":
    raise SystemExit(main())
