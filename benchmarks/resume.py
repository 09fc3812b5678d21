"""Resume time benchmark: does resuming late in a large epoch cost more than resuming early?

A map-style dataset of ``--samples`` tiny samples (default 3 million: an int each, so
loading is free and only ferry's own work shows), batch 64, ``shuffle=True``, a trivial
model and SGD. For each fraction of the epoch (10% and 90%), a real training run is
interrupted with a real SIGUSR1 sent to itself at that step; ferry commits a checkpoint
at the next safe point and the run exits 85. Then, in interleaved rounds, a fresh process
resumes from each checkpoint and is timed from its start (``Popen``) until its first
training batch arrives, which it stamps and then exits. Figures are medians over rounds.

    resume time at 90% of the epoch / at 10%                          (goal <= 1.2)

Also reported, not held to a goal: the part of it spent in ferry (from ``ferry.track``,
which finds and loads the checkpoint, to the first batch: restore plus the skip of the
consumed batches at the sampler), and the interrupted runs' step cost.

Run: ``python benchmarks/resume.py [--samples 3000000] [--rounds 5] [--dir D] [--json]``.
The ratio is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

GOAL = 1.2
FRACTIONS = (0.1, 0.9)
BATCH = 64
EXIT_CHECKPOINTED = 85


# ---------------------------------------------------------------------- the child
def child(argv: list[str]) -> int:
    """The training script: trains until ``--stop-at`` (then signals itself), or, when
    resumed, stamps its first batch and exits at once."""
    t_start = float(argv[argv.index("--t0") + 1]) if "--t0" in argv else time.time()
    samples = int(argv[argv.index("--samples") + 1])
    stop_at = int(argv[argv.index("--stop-at") + 1]) if "--stop-at" in argv else -1

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    import ferry

    t_imported = time.time()

    class Tiny(Dataset[int]):
        def __len__(self) -> int:
            return samples

        def __getitem__(self, i: int) -> int:
            return i

    torch.manual_seed(0)
    model = nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(Tiny(), batch_size=BATCH, shuffle=True)
    t_track = time.time()
    ferry.track(loader=loader, model=model, optimizer=opt)
    t_loop = time.time()
    for batch in loader:
        if ferry.resumed:
            t_first = time.time()
            print(
                json.dumps(
                    {
                        "first_batch": t_first,
                        "since_start": t_first - t_start,
                        "imports": t_imported - t_start,
                        "setup": t_track - t_imported,
                        "ferry": t_first - t_track,
                        "restored_step": ferry.restored_step,
                        "first_indices": batch[:4].tolist(),
                    }
                ),
                flush=True,
            )
            ferry.close()
            return 0
        if ferry.global_step == stop_at:
            print(json.dumps({"loop_seconds": time.time() - t_loop, "steps": stop_at}), flush=True)
            os.kill(os.getpid(), signal.SIGUSR1)
        x = batch.to(torch.float32).unsqueeze(1) / samples
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    print(json.dumps({"finished": True, "loop_seconds": time.time() - t_loop}), flush=True)
    return 0


# ---------------------------------------------------------------------- the parent
def _env(root: str, name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env.update(
        FERRY_HOME=os.path.join(root, "home"),
        FERRY_DIR=os.path.join(root, f"ck-{name}"),
        FERRY_JOB_ID=f"bench-{name}",
        PYTHONWARNINGS="ignore",
    )
    return env


def _spawn(args: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", "--t0", repr(t0), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return t0, proc


def _last_json(out: str) -> dict[str, Any]:
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            doc: dict[str, Any] = json.loads(line)
            return doc
    raise RuntimeError(f"the child printed no result:\n{out}")


def interrupt(root: str, name: str, samples: int, stop_at: int) -> dict[str, Any]:
    """Train to ``stop_at``, signal, checkpoint, exit 85: the checkpoint resumes measure."""
    _, proc = _spawn(["--samples", str(samples), "--stop-at", str(stop_at)], _env(root, name))
    if proc.returncode != EXIT_CHECKPOINTED:
        raise RuntimeError(f"the interrupted run exited {proc.returncode}, not 85:\n{proc.stderr[-3000:]}")
    loop = _last_json(proc.stdout)["loop_seconds"]
    return {"stop_at": stop_at, "seconds": loop, "step_us": 1e6 * loop / max(stop_at, 1)}


def resume(root: str, name: str, samples: int) -> dict[str, Any]:
    t0, proc = _spawn(["--samples", str(samples)], _env(root, name))
    if proc.returncode != 0:
        raise RuntimeError(f"the resumed run exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    doc = _last_json(proc.stdout)
    if "since_start" not in doc:
        raise RuntimeError(f"the resumed run did not resume:\n{proc.stderr[-3000:]}")
    doc["wall_to_first_batch"] = doc["first_batch"] - t0
    return doc


def run(samples: int, rounds: int, root: str) -> dict[str, Any]:
    steps = -(-samples // BATCH)
    names = {f: f"{round(f * 100)}pct" for f in FRACTIONS}
    interrupted = {}
    for f in FRACTIONS:
        interrupted[names[f]] = interrupt(root, names[f], samples, int(f * steps))
    measured: dict[str, list[dict[str, Any]]] = {n: [] for n in names.values()}
    resume(root, names[FRACTIONS[0]], samples)  # warm-up: page cache, bytecode, allocator
    for r in range(rounds):
        order = list(names.values()) if r % 2 == 0 else list(reversed(names.values()))
        for n in order:
            measured[n].append(resume(root, n, samples))
    for f in FRACTIONS:  # a real checkpoint at the real position: the safe point after the signal
        got = {m["restored_step"] for m in measured[names[f]]}
        if got != {int(f * steps)}:
            raise RuntimeError(f"resumed at steps {got}, expected {int(f * steps)}")
    med = {
        n: {
            key: statistics.median(m[key] for m in ms)
            for key in ("wall_to_first_batch", "since_start", "imports", "setup", "ferry")
        }
        for n, ms in measured.items()
    }
    early, late = names[FRACTIONS[0]], names[FRACTIONS[1]]
    return {
        "samples": samples,
        "batch": BATCH,
        "steps_per_epoch": steps,
        "rounds": rounds,
        "interrupted": interrupted,
        "median_s": med,
        "all_s": {n: [m["wall_to_first_batch"] for m in ms] for n, ms in measured.items()},
        "load_average": list(os.getloadavg()),
        "ferry_part_ratio": med[late]["ferry"] / med[early]["ferry"],
        "goal": f"<= {GOAL}",
        "goal_met": med[late]["wall_to_first_batch"] / med[early]["wall_to_first_batch"] <= GOAL,
        "ratio": med[late]["wall_to_first_batch"] / med[early]["wall_to_first_batch"],
    }


def report(res: dict[str, Any]) -> str:
    lines = [
        f"epoch: {res['samples']:,} samples, batch {res['batch']}, {res['steps_per_epoch']:,} steps, "
        f"shuffle=True; {res['rounds']} interleaved rounds, medians"
    ]
    for name, it in res["interrupted"].items():
        lines.append(
            f"  interrupted at {name:>5}: step {it['stop_at']:,}, training loop {it['seconds']:.1f} s "
            f"({it['step_us']:.0f} us/step)"
        )
    lines.append("  resumed at   start->first batch   of which: imports     setup     ferry (track->batch)")
    for name, m in res["median_s"].items():
        lines.append(
            f"  {name:>10}   {m['wall_to_first_batch']:16.3f} s   {m['imports']:15.3f} s "
            f"{m['setup']:7.3f} s {m['ferry']:7.3f} s"
        )
    lines.append(f"  ferry part alone, 90% / 10%: {res['ferry_part_ratio']:.3f} (not held to a goal)")
    lines.append(f"  machine load average at the end: {', '.join(f'{x:.2f}' for x in res['load_average'])}")
    lines.append("")
    met = "yes" if res["goal_met"] else "NO"
    lines.append(f"resume_90pct_vs_10pct  {res['ratio']:.3f}  {res['goal']}  {met}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--child" in argv:
        return child(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=3_000_000, help="epoch size (default 3,000,000)")
    p.add_argument("--rounds", type=int, default=5, help="measured rounds, >= 3 (default 5)")
    p.add_argument("--dir", default=None, help="where to write (default: a new temp folder)")
    p.add_argument("--json", action="store_true", help="print the results as JSON (ratio last)")
    args = p.parse_args(argv)
    if args.rounds < 3 or args.samples < 100 * BATCH:
        p.error("--rounds must be >= 3 and --samples >= 6400")
    root = tempfile.mkdtemp(prefix="ferry-bench-resume-", dir=args.dir)
    try:
        res = run(args.samples, args.rounds, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(res, indent=2) if args.json else report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
