"""Steady-state overhead of running under `ferry run` (zero-code mode) vs plain python.

Each round runs the same small training script twice, once plainly and once under
`ferry run`, interleaved so both see the same machine noise. The script times its own
steady-state steps (after a warm-up), so start-up is not counted. Goal: ratio <= 1.01.

    python benchmarks/overhead.py [--rounds 5] [--steps 400] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKLOAD = r"""
import sys, time, torch
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
done, t0 = 0, None
while done < steps:
    for x, y in loader:
        if done == warmup:
            t0 = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        done += 1
        if done == steps:
            break
    sched.step()
print((time.perf_counter() - t0) / (steps - warmup))
"""


def one(cmd_prefix: list[str], script: str, steps: int, env: dict[str, str]) -> float:
    out = subprocess.run([*cmd_prefix, sys.executable, script, str(steps)], env=env, check=True,
                         capture_output=True, text=True)  # fmt: skip
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    ferry = str(Path(sys.executable).parent / "ferry")
    with tempfile.TemporaryDirectory(prefix="ferry-overhead-") as tmp:
        script = os.path.join(tmp, "workload.py")
        Path(script).write_text(WORKLOAD)
        env = dict(os.environ, FERRY_HOME=os.path.join(tmp, "home"), OMP_NUM_THREADS="1")
        plain, under = [], []
        for r in range(args.rounds):
            ck = os.path.join(tmp, f"ck{r}")
            plain.append(one([], script, args.steps, env))
            under.append(
                one([ferry, "run", "--dir", ck, "--job-id", f"bench{r}", "--"], script, args.steps, env)
            )
            if not args.json:
                print(f"round {r + 1}: plain {plain[-1] * 1e3:.3f} ms/step, "
                      f"under ferry run {under[-1] * 1e3:.3f} ms/step", flush=True)  # fmt: skip
    ratio = statistics.median(under) / statistics.median(plain)
    result = {"rounds": args.rounds, "steps": args.steps,
              "plain_ms_per_step": statistics.median(plain) * 1e3,
              "ferry_ms_per_step": statistics.median(under) * 1e3,
              "ratio": ratio, "goal": 1.01}  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        plain_ms = result["plain_ms_per_step"]
        print(f"step time under ferry run / plain python: {ratio:.4f} (goal <= 1.01; median of "
              f"{args.rounds} interleaved rounds, {plain_ms:.3f} ms/step plain)")  # fmt: skip


if __name__ == "__main__":
    main()
