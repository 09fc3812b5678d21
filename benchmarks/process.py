"""Process-level suspend and wake against the GPU's own copy speed (needs an NVIDIA GPU).

For each size N, a child process that knows nothing of ferry holds N GiB on the GPU;
ferry suspends it (lock + checkpoint: the driver copies N GiB to host memory and
releases the GPU) and wakes it (restore + unlock), several times. In the same run the
same bytes are copied device-to-host into pinned memory with ``Tensor.copy_``, the
fastest a plain copy of them goes. The figure printed last is suspend throughput over
that pinned copy throughput, for the largest N.

    python benchmarks/process.py [--gib 1 4 8] [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

HOLDER = """
import sys, time, torch
n = int(sys.argv[1])
x = torch.empty(n, dtype=torch.uint8, device="cuda")
x.random_(0, 256)
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(3600)
"""


def why_not() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if torch.version.cuda is None or torch.cuda.device_count() == 0:
        return f"no CUDA GPU (torch {torch.__version__})"
    from ferry.errors import FerryError
    from ferry.process import load_driver

    try:
        load_driver()
    except FerryError as exc:
        return str(exc)
    return None


def pinned_d2h_seconds(nbytes: int, reps: int) -> float:
    """Best of ``reps``: device-to-host copy of ``nbytes`` into pinned memory."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 256)
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst.copy_(src, non_blocking=True)  # warm up: first touch of the pinned pages
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    del src, dst
    torch.cuda.empty_cache()
    return best


def suspend_wake_seconds(nbytes: int, reps: int) -> tuple[float, float]:
    """Best of ``reps`` suspend and wake of a child holding ``nbytes`` on the GPU."""
    from ferry.process import CudaProcess

    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(nbytes)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        process = CudaProcess(child.pid)
        best_s = best_w = float("inf")
        for _ in range(reps):
            best_s = min(best_s, process.suspend(timeout=60).seconds)
            best_w = min(best_w, process.wake().seconds)
        return best_s, best_w
    finally:
        child.kill()
        child.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, nargs="+", default=[1.0, 4.0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    reason = why_not()
    if reason:
        sys.exit(f"process benchmark cannot run here: {reason}")
    import torch

    rows: list[dict[str, Any]] = []
    for gib in args.gib:
        nbytes = int(gib * 2**30)
        copy = pinned_d2h_seconds(nbytes, args.reps)
        suspend, wake = suspend_wake_seconds(nbytes, args.reps)
        gb = nbytes / 1e9
        rows.append(
            {
                "gib": gib,
                "gpu": torch.cuda.get_device_name(),
                "suspend_s": suspend,
                "wake_s": wake,
                "pinned_d2h_s": copy,
                "suspend_gbps": gb / suspend,
                "wake_gbps": gb / wake,
                "pinned_d2h_gbps": gb / copy,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'GiB':>6} {'suspend s':>10} {'GB/s':>7} {'wake s':>9} {'GB/s':>7} {'pinned D2H GB/s':>16}")
        for r in rows:
            print(
                f"{r['gib']:>6.1f} {r['suspend_s']:>10.3f} {r['suspend_gbps']:>7.2f} {r['wake_s']:>9.3f} "
                f"{r['wake_gbps']:>7.2f} {r['pinned_d2h_gbps']:>16.2f}"
            )
    last = rows[-1]
    print(
        f"suspend throughput / pinned D2H copy ({last['gib']:.1f} GiB on {last['gpu']}): "
        f"{last['suspend_gbps'] / last['pinned_d2h_gbps']:.2f}"
    )


if __name__ == "__main__":
    main()
