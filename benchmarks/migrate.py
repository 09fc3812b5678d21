"""Migration downtime benchmark: warm migration (the target worker starts beside the old one)
against the restart it replaces, on real ``ferry run`` jobs moved with ``ferry migrate``.

A job is an MLP with AdamW on the CPU, sized so that its state (parameters and both moments)
is ``--size-mb`` (default: one job of 80 MiB and one of 1024 MiB), trained under
``ferry run --restarts N`` in explicit mode. Each round moves it twice warm (to devices 1,
then back to 0) and twice cold (``--cold``), interleaved, so that the load of a shared
machine hits both alike; figures are medians over ``--rounds`` (at least 5) migrations of
each kind. ``ferry migrate --json`` reports each migration's parts, measured in the same run
(docs/cli.md): drain (to the next safe point), save, hand-over, restore, first step.

    warm downtime / (drain + save + restore) of the same migration        (goal <= 1.3)
    warm downtime (s), 80 MiB job                                          (goal <= 1.0)

Reported beside them, without a goal: the cold downtime (with its first step's warm-up, as
the warm one has it) and warm / cold, and the warm worker's start-up hidden behind training.
The first step counts only as far as it took longer than the second (docs/cli.md).
CUDA_VISIBLE_DEVICES only changes a CPU job's environment: the devices are not checked
(``--unchecked-devices``).

Run: ``python benchmarks/migrate.py [--size-mb 80 --size-mb 1024] [--rounds 5] [--dir D]
[--json]``. The figure summary is printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

GOAL_RATIO = 1.3
GOAL_SECONDS_80 = 1.0
FERRY = [sys.executable, "-c", "from ferry.cli import main; main()"]


# ---------------------------------------------------------------------- the child
def child(size_mb: int) -> None:
    """Train the MLP until stopped: ``ferry run`` restarts or releases it on each move."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import ferry

    params = size_mb * 2**20 // 4 // 3  # parameters, AdamW's two moments: three floats each
    width = int(math.sqrt(params / 2))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.zeros(1, width)).sum().backward()
    opt.step()  # the moments exist from the start: the state has its full size at once
    opt.zero_grad()
    data = TensorDataset(torch.randn(256, width))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    ferry.track(loader=loader, model=model, optimizer=opt)
    for _epoch in range(10**6):
        for (x,) in loader:
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.02)  # a step of some length, as training has; and the machine is shared


# ---------------------------------------------------------------------- the parent
def ferry(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = subprocess.run([*FERRY, *args], env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"ferry {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def training(env: dict[str, str], job: str) -> bool:
    try:
        doc = ferry(env, "status", job, "--json")
    except (RuntimeError, ValueError):
        return False
    return doc.get("state") in ("running", "resumed") and int(doc.get("step") or 0) >= 3


def measure(root: str, size_mb: int, rounds: int) -> dict[str, Any]:
    job = f"bench-{size_mb}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env.update(FERRY_HOME=os.path.join(root, "home"), PYTHONWARNINGS="ignore")
    argv = [*FERRY, "run", "--no-autotrack", "--job-id", job, "--dir", os.path.join(root, f"ck-{size_mb}"),
            "--restarts", str(4 * rounds + 1), "--keep-last", "2", "--env", "CUDA_VISIBLE_DEVICES=0",
            "--", sys.executable, os.path.abspath(__file__), "--child", str(size_mb)]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    warm: list[dict[str, Any]] = []
    cold: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 600
        while not training(env, job):
            if proc.poll() is not None or time.monotonic() > deadline:
                said = proc.stderr.read() if proc.stderr else ""
                raise RuntimeError(f"the job did not start training:\n{said}")
            time.sleep(0.2)
        for _ in range(rounds):
            for to, kind in (("1", "warm"), ("0", "cold"), ("1", "cold"), ("0", "warm")):
                extra = ["--cold"] if kind == "cold" else []
                doc = ferry(env, "migrate", job, "--to", to, "--unchecked-devices", "--json", *extra)
                if doc["warm"] != (kind == "warm"):
                    raise RuntimeError(f"a {kind} migration went {'warm' if doc['warm'] else 'cold'}: {doc}")
                (warm if kind == "warm" else cold).append(doc)
                print(f"  {size_mb} MiB {kind}: downtime {doc['downtime']:.3f} s", file=sys.stderr)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(300)
        except subprocess.TimeoutExpired:
            proc.kill()
    med = statistics.median
    warm_keys, cold_keys = ("drain", "handover", "save", "restore", "first_step"), (
        "drain", "save", "restart", "restore", "first_step")  # fmt: skip
    ratio = [d["downtime"] / (d["drain"] + d["save"] + d["restore"]) for d in warm]
    cold_down = [d["downtime"] + (d["first_step"] or 0.0) for d in cold]
    return {
        "size_mb": size_mb,
        "migrations": {"warm": len(warm), "cold": len(cold)},
        "warm_downtime": med(d["downtime"] for d in warm),
        "warm_parts": {k: med(d[k] or 0.0 for d in warm) for k in warm_keys},
        "warm_startup_hidden": med(d["warm_startup"] for d in warm),
        "warm_vs_drain_save_restore": med(ratio),
        "cold_downtime": med(cold_down),
        "cold_parts": {k: med(d[k] or 0.0 for d in cold) for k in cold_keys},
        "warm_vs_cold": med(d["downtime"] for d in warm) / med(cold_down),
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, action="append", help="state size of a job (repeatable)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of 2 warm + 2 cold moves (>= 3)")
    p.add_argument("--dir", default=None, help="where the jobs' folders go [default: a temporary folder]")
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        child(args.child)
        return 0
    sizes = args.size_mb or [80, 1024]
    root = tempfile.mkdtemp(prefix="ferry-bench-migrate-", dir=args.dir)
    try:
        results = [measure(root, size, max(args.rounds, 3)) for size in sizes]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=1))
    for r in results:
        wp, cp = r["warm_parts"], r["cold_parts"]
        print(
            f"{r['size_mb']} MiB state, medians of {r['migrations']['warm']} warm and "
            f"{r['migrations']['cold']} cold migrations:\n"
            f"  warm downtime {r['warm_downtime']:.3f} s = drain {wp['drain']:.3f} + hand-over "
            f"{wp['handover']:.3f} (save {wp['save']:.3f}) + restore {wp['restore']:.3f} + first step "
            f"{wp['first_step']:.3f}; start-up hidden behind training {r['warm_startup_hidden']:.2f} s\n"
            f"  cold downtime {r['cold_downtime']:.3f} s = drain {cp['drain']:.3f} + save {cp['save']:.3f} "
            f"+ restart {cp['restart']:.3f} + restore {cp['restore']:.3f} + first step {cp['first_step']:.3f}"
        )
    print("figures (goal in brackets):")
    for r in results:
        mark = "ok" if r["warm_vs_drain_save_restore"] <= GOAL_RATIO else "MISSED"
        print(
            f"  {r['size_mb']} MiB: warm downtime / (drain + save + restore) "
            f"{r['warm_vs_drain_save_restore']:.2f} (<= {GOAL_RATIO}) {mark}; warm / cold downtime "
            f"{r['warm_vs_cold']:.3f}"
        )
        if r["size_mb"] <= 100:
            mark = "ok" if r["warm_downtime"] <= GOAL_SECONDS_80 else "MISSED"
            seconds = r["warm_downtime"]
            print(f"  {r['size_mb']} MiB: warm downtime {seconds:.3f} s (<= {GOAL_SECONDS_80} s) {mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
