"""Steady-state overhead of running under `ferry run` (zero-code mode) vs plain python,
without saves and with periodic saves or a stream of checkpoint requests.

Each round runs the same small training script once per row, interleaved (the order
rotates from round to round) so that every row sees the same machine noise. The script
times its own steps after a warm-up, so start-up is not counted; what a save costs the
steps it interrupts is. Rows, as step-time ratios to plain python, with their goals:

- ``ferry run``, no saves                                           <= 1.01
- ``ferry run --every-steps 50``                                    (no goal)
- ``ferry run --every-seconds 1``: one save a second                <= 1.03
- ``ferry run`` while ``--request-rate`` checkpoint requests a
  second arrive (default 10, dropped as `ferry checkpoint` drops
  them): training keeps >= 90% of its speed                         <= 1.11

Each row also reports the saves the worker committed and the median "training blocked"
it reported for them, beside the median stall the script itself felt at a save (the step
that held the save, less the median step).

    python benchmarks/overhead.py [--rounds 5] [--steps 400] [--request-rate 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from jobrun import ferry_command, run_job_process

WORKLOAD = r"""
import json, sys, time, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
steps, warmup = int(sys.argv[1]), 50
torch.manual_seed(0)
torch.set_num_threads(1)
data = TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))
loader = DataLoader(data, batch_size=64, shuffle=True)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.9)
done, t0, last = 0, None, None
while done < steps:
    for x, y in loader:
        now = time.perf_counter()
        if done == warmup:
            t0 = last = now
            lengths = []
        elif done > warmup:
            lengths.append(now - last)
            last = now
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        done += 1
        if done == steps:
            break
    sched.step()
lengths.append(time.perf_counter() - last)
print(json.dumps({"mean": (time.perf_counter() - t0) / (steps - warmup), "lengths": lengths}))
"""

GOALS = {"no_saves": 1.01, "every_second": 1.03, "requests": 1 / 0.9}
ROWS = ("plain", "no_saves", "every_50_steps", "every_second", "requests")


def run_row(
    row: str, r: int, script: str, steps: int, tmp: str, env: dict[str, str], rate: float
) -> dict[str, Any]:
    """One run of ``row``: the script's step times, and the saves its worker reported."""
    ferry = ferry_command()
    job = f"{row}-{r}"
    options = {"every_50_steps": ["--every-steps", "50"], "every_second": ["--every-seconds", "1"]}
    prefix = [] if row == "plain" else [*ferry, "run", "--dir", os.path.join(tmp, job), "--job-id", job,
                                        *options.get(row, []), "--"]  # fmt: skip
    stop = threading.Event()
    asker = None
    if row == "requests":
        asker = threading.Thread(target=_ask, args=(job, rate, stop, env), daemon=True)
        asker.start()
    try:
        out = run_job_process([*prefix, sys.executable, script, str(steps)], env)
    finally:
        stop.set()
        if asker is not None:
            asker.join()
    timing = json.loads(out.stdout.strip().splitlines()[-1])
    saves = [] if row == "plain" else _saves(job, env)
    return {"mean": timing["mean"], "lengths": timing["lengths"], "saves": saves}


def _ask(job_id: str, rate: float, stop: threading.Event, env: dict[str, str]) -> None:
    """Drop ``rate`` checkpoint requests a second into the job's control folder."""
    os.environ["FERRY_HOME"] = env["FERRY_HOME"]
    from ferry.runtime.control import submit
    from ferry.runtime.jobdir import JobDir

    job = JobDir.create(job_id)
    while not stop.wait(1 / rate):
        submit(job, "checkpoint")


def _saves(job_id: str, env: dict[str, str]) -> list[dict[str, Any]]:
    os.environ["FERRY_HOME"] = env["FERRY_HOME"]
    from ferry.runtime.jobdir import JobDir

    return [dict(e) for e in JobDir.create(job_id).events() if e["event"] == "checkpoint"]


def felt(lengths: list[float], saves: int) -> float | None:
    """The median of the ``saves`` longest steps less the median step: what a save felt
    like from the script (None without saves)."""
    if not saves or not lengths:
        return None
    ranked = sorted(lengths)
    return statistics.median(ranked[-saves:]) - statistics.median(ranked)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--request-rate", type=float, default=10.0, help="checkpoint requests a second")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    results: dict[str, list[dict[str, Any]]] = {row: [] for row in ROWS}
    with tempfile.TemporaryDirectory(prefix="ferry-overhead-") as tmp:
        script = os.path.join(tmp, "workload.py")
        Path(script).write_text(WORKLOAD)
        env = dict(os.environ, FERRY_HOME=os.path.join(tmp, "home"), OMP_NUM_THREADS="1")
        for r in range(args.rounds):
            for i in range(len(ROWS)):
                row = ROWS[(i + r) % len(ROWS)]
                results[row].append(run_row(row, r, script, args.steps, tmp, env, args.request_rate))
            if not args.json:
                line = ", ".join(f"{row} {results[row][-1]['mean'] * 1e3:.2f}" for row in ROWS)
                print(f"round {r + 1} (ms/step): {line}", flush=True)
    summary = summarize(results)
    summary.update(rounds=args.rounds, steps=args.steps, request_rate=args.request_rate)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(report(summary))


def summarize(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    plain = statistics.median(x["mean"] for x in results["plain"])
    rows: dict[str, Any] = {}
    for row in ROWS:
        runs = results[row]
        saves = [len(x["saves"]) for x in runs]
        blocked = [s["blocking_seconds"] for x in runs for s in x["saves"]]
        stalls = [f for x in runs if (f := felt(x["lengths"], len(x["saves"]))) is not None]
        mean = statistics.median(x["mean"] for x in runs)
        rows[row] = {
            "ms_per_step": mean * 1e3,
            "ratio": mean / plain,
            "saves_per_run": statistics.median(saves),
            "blocked_ms": statistics.median(blocked) * 1e3 if blocked else None,
            "felt_stall_ms": statistics.median(stalls) * 1e3 if stalls else None,
        }
        if row in GOALS:
            rows[row]["goal"] = GOALS[row]
            rows[row]["met"] = mean / plain <= GOALS[row]
    return {"rows": rows}


def report(summary: dict[str, Any]) -> str:
    lines = [f"{summary['rounds']} interleaved rounds of {summary['steps']} steps, medians; "
             f"requests: {summary['request_rate']:g} a second"]  # fmt: skip
    lines.append(f"{'row':<16}{'ms/step':>9}{'ratio':>8}{'saves':>7}{'blocked ms':>12}{'felt ms':>9}  goal")
    for row, v in summary["rows"].items():
        blocked = "-" if v["blocked_ms"] is None else f"{v['blocked_ms']:.1f}"
        stall = "-" if v["felt_stall_ms"] is None else f"{v['felt_stall_ms']:.1f}"
        goal = f"<= {v['goal']:.3f} {'yes' if v['met'] else 'NO'}" if "goal" in v else ""
        lines.append(f"{row:<16}{v['ms_per_step']:9.3f}{v['ratio']:8.3f}{v['saves_per_run']:7g}"
                     f"{blocked:>12}{stall:>9}  {goal}")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
