"""What a background save costs the training loop: ferry's against ``dcp.async_save``'s.

``peers.py`` times one call of each tool on a plain state. A training job feels something
else: the time its loop stands still for a save. Here one process trains (``--mib`` MiB of
parameters in 4 MiB tensors, updated by an SGD optimizer whose steps find no gradients, so
they change nothing and cost nothing; each step's compute is a sleep of ``--step-ms``, the
same whatever the machine's load, like ``ranks.py``), and a save is due every 10 steps.
The time a save blocks the loop is counted from the saving step's call to its end plus the
next optimizer step (which is where ferry's ``overlap_snapshot`` waits for its copies):

- ferry, asynchronous (the default): the safe point copies everything;
- ferry, asynchronous with ``overlap_snapshot``: the parameters are copied while the next
  step's compute runs, and its optimizer step waits for what is left;
- ``dcp.async_save`` of the model's and the optimizer's ``state_dict`` (one stager reused,
  plain host memory: pinned where this torch has CUDA);
- a memcpy of the same bytes into a warm buffer (numpy, one thread), for scale.

Every save waits for the one before to commit, outside the timed span. Rounds rotate the
order; the figures are medians over the rounds (round 0, a warm-up, is not counted).
Goal held (issue 31): blocked, ferry's / ``dcp.async_save``'s <= 1/3, met only with
``overlap_snapshot`` (opt-in, docs/api.md) when the step's compute outlasts the copy: without
it every asynchronous save must copy the bytes before training may change them.

    python benchmarks/loop_peers.py [--mib 512] [--rounds 5] [--step-ms 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

import ferry
from ferry.session.api import current

KINDS = ("ferry_async", "ferry_overlap", "dcp_async", "memcpy")
GOAL = 1 / 3


class Loop:
    """The training loop of the benchmark, under a ferry session whose saves come on demand."""

    def __init__(self, mib: int, step_s: float, root: str) -> None:
        self.step_s = step_s
        self.model = torch.nn.ParameterList(torch.randn(1 << 20) for _ in range(max(1, mib // 4)))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        ferry.configure(dir=os.path.join(root, "ferry"), job_dir=os.path.join(root, "job"),
                        keep_last=1, overlap_snapshot=True)  # fmt: skip
        ferry.track(model=self.model, opt=self.opt)
        session = current()
        assert session is not None
        self.session = session
        self.dcp_path = os.path.join(root, "dcp")
        pin = torch.cuda.is_available()
        options = StagingOptions(
            use_pinned_memory=pin, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=pin
        )
        self.stager = DefaultStager(options)
        self.floor = [np.empty(p.numel(), dtype=np.float32) for p in self.model]

    def train_step(self) -> float:
        """Compute (a sleep), then the optimizer's step; returns the step's time."""
        time.sleep(self.step_s)
        t0 = time.perf_counter()
        self.opt.step()
        return time.perf_counter() - t0

    def steps_until_due(self) -> None:
        """Train, saving nothing, up to the step before a save is due; nothing in flight."""
        s = self.session
        s.config.every_steps = None  # (the object the session's parts share)
        while (s.global_step + 1) % 10:
            self.train_step()
            ferry.step()
        s.checkpointer.wait()

    def blocked(self, kind: str) -> float:
        self.steps_until_due()
        s = self.session
        if kind.startswith("ferry"):
            s.checkpointer.overlap.on = kind == "ferry_overlap"
            s.config.every_steps, s.config.async_save = 10, True
        self.train_step()
        t0 = time.perf_counter()
        future = None
        if kind.startswith("ferry"):
            ferry.step()  # the 10th: a save is due
        else:
            ferry.step()  # (none due: every_steps is off)
            if kind == "dcp_async":
                state = {"model": self.model.state_dict(), "opt": self.opt.state_dict()}
                where, stager = self.dcp_path, self.stager
                future = dcp.async_save(state, checkpoint_id=where, no_dist=True, async_stager=stager)
            else:
                for dst, p in zip(self.floor, self.model, strict=True):
                    np.copyto(dst, p.detach().numpy())
        at_call = time.perf_counter() - t0
        waited = self.train_step()
        if future is not None:
            future.result()  # type: ignore[union-attr]
        s.checkpointer.wait()
        return at_call + waited

    def close(self) -> None:
        self.stager.close()


def run(mib: int, rounds: int, step_ms: float, root: str) -> dict[str, Any]:
    loop = Loop(mib, step_ms / 1000, root)
    samples: dict[str, list[float]] = {k: [] for k in KINDS}
    try:
        for r in range(rounds + 1):  # round 0: warm-up (buffers allocated, files created)
            for i in range(len(KINDS)):
                kind = KINDS[(i + r) % len(KINDS)]
                seconds = loop.blocked(kind)
                if r:
                    samples[kind].append(seconds)
    finally:
        loop.close()
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "mib": mib,
        "step_ms": step_ms,
        "median_s": med,
        "samples_s": samples,
        "ratios": {
            "overlap_vs_dcp_async": med["ferry_overlap"] / med["dcp_async"],
            "async_vs_dcp_async": med["ferry_async"] / med["dcp_async"],
            "async_vs_memcpy": med["ferry_async"] / med["memcpy"],
        },
        "load_average": os.getloadavg(),
    }


def report(res: dict[str, Any], rounds: int) -> str:
    lines = [f"{res['mib']} MiB of parameters, a step of {res['step_ms']:.0f} ms, {rounds} rounds, "
             f"medians (load average at the end: {', '.join(f'{x:.1f}' for x in res['load_average'])})",
             "training blocked by a save (the saving step's call and the next optimizer step):"]  # fmt: skip
    for kind, value in res["median_s"].items():
        lines.append(f"  {kind:<14} {value:8.4f} s")
    for name, value in res["ratios"].items():
        met = "yes" if value <= GOAL else "NO"
        goal = f"<= {GOAL:.3g} {met}" if name == "overlap_vs_dcp_async" else "(no goal)"
        lines.append(f"  {name:<22} {value:7.3f}  {goal}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=512, help="parameters in MiB (default 512)")
    p.add_argument("--rounds", type=int, default=5, help="measured rounds, >= 1 (default 5)")
    p.add_argument("--step-ms", type=float, default=200.0, help="each step's compute, a sleep (default 200)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.mib < 4 or args.step_ms < 0:
        p.error("--rounds must be >= 1, --mib >= 4, --step-ms >= 0")
    warnings.filterwarnings("ignore")  # DCP warns that no process group is initialised
    root = tempfile.mkdtemp(prefix="ferry-loop-peers-")
    try:
        res = run(args.mib, args.rounds, args.step_ms, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(res, indent=2) if args.json else report(res, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
