"""Start-up time of the commands that neither train nor load tensors, against Python's own.

For each command: the median wall time of N fresh runs (``python -c "from ferry.cli import
main; main()" ARGS``, as the ``ferry`` entry point runs it), and its ratio to ``python -c
pass`` timed in the same run, interleaved with the commands so a busy machine slows both.
The checkpoint (inspect, verify) and the job directories (list, status, completion) are
real: written by ferry's engine and by ``ferry run`` into a temporary FERRY_HOME.

    python benchmarks/startup.py [--runs 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

FERRY = [sys.executable, "-c", "from ferry.cli import main; main()"]


def world(tmp: str) -> tuple[str, dict[str, str]]:
    """A real checkpoint root and two finished jobs; returns the root and the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env["FERRY_HOME"] = os.path.join(tmp, "home")
    ckpt = os.path.join(tmp, "ckpt")
    make = "import torch\nfrom ferry.engine import save\nsave({'w': torch.ones(256, 256)}, %r, step=1)"
    subprocess.run([sys.executable, "-c", make % ckpt], check=True, env=env)
    for job in ("job2", "job10"):
        cmd = [
            *FERRY,
            "run",
            "--no-autotrack",
            "--job-id",
            job,
            "--dir",
            os.path.join(tmp, job),
            "--",
            "true",
        ]
        subprocess.run(cmd, check=True, env=env, capture_output=True)
    return ckpt, env


def commands(ckpt: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    complete = {"_FERRY_COMPLETE": "bash_complete", "COMP_WORDS": "ferry status jo", "COMP_CWORD": "2"}
    return {
        "python -c pass": ([sys.executable, "-c", "pass"], {}),
        "ferry --help": ([*FERRY, "--help"], {}),
        "ferry": ([*FERRY], {}),
        "completion (job ids)": ([*FERRY], complete),
        "ferry list": ([*FERRY, "list", "--all"], {}),
        "ferry status JOB": ([*FERRY, "status", "job2"], {}),
        "ferry inspect CKPT": ([*FERRY, "inspect", ckpt, "--tensors"], {}),
        "ferry verify CKPT": ([*FERRY, "verify", ckpt], {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="runs per command (median taken)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ferry-startup-") as tmp:
        ckpt, env = world(tmp)
        todo = commands(ckpt)
        times: dict[str, list[float]] = {name: [] for name in todo}
        for _ in range(args.runs):
            for name, (argv, extra) in todo.items():  # interleaved: load hits every command alike
                t0 = time.perf_counter()
                subprocess.run(
                    argv, env={**env, **extra}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["python -c pass"])
    rows = {
        name: {"median_s": statistics.median(t), "ratio": statistics.median(t) / base}
        for name, t in times.items()
    }
    if args.json:
        print(json.dumps({"runs": args.runs, "python": sys.version.split()[0], "commands": rows}, indent=2))
        return
    width = max(map(len, rows))
    print(f"{'command':<{width}}  median (s)  x python -c pass   ({args.runs} runs each)")
    for name, row in rows.items():
        print(f"{name:<{width}}  {row['median_s']:10.3f}  {row['ratio']:16.1f}")


if __name__ == "__main__":
    main()
