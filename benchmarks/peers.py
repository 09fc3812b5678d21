"""ferry against the tools a user would pick instead, side by side in one run.

The state is ``--sizes`` MiB of float32 in 64 tensors (default 512; ``--sizes 512 4096``
adds a 4 GiB state, which needs about five times its size in free memory and minutes a
round on a 2-core host: not in the default run). Every round runs each contender once,
in an order that rotates from round to round, so that a shared machine's drifts hit them
all alike; the figures are medians over the rounds (round 0, a warm-up, is not counted).

Saves, each writing over its own previous round's files:

- ``ferry.save`` (synchronous; ``keep_last=1``: the retired checkpoint is deleted in the
  background, after the save returned, and the next contender starts once that is done)
- ``torch.save`` + fsync
- ``torch.distributed.checkpoint.save`` (DCP; its writer fsyncs)
- ferry's ``AsyncSaver.save``: the time it blocked the caller, and until its commit
- ``dcp.async_save``: likewise, with one stager reused from save to save (pinned-memory
  staging where this torch can pin, i.e. has CUDA; plain host memory otherwise)
- a plain memcpy of the same bytes into a warm buffer (numpy, one thread): the floor of
  any asynchronous save's blocked time

Loads, warm (each file read once just before; ``--cold`` drops its pages instead):

- ``ferry.load`` into new tensors, and ``torch.load(weights_only=True)``
- ``ferry.load(into=...)`` in place, and ``dcp.load`` (which loads in place)

Goals (ratios of medians):

- sync save: DCP's time / ferry's                                   >= 1.5
- async save blocked: ferry's / the memcpy                          <= 1.3
- async save blocked: ferry's / dcp.async_save's                    <= 1/3
- load: torch.load's time / ferry's (new tensors)                   >= 1.1
- load: dcp.load's time / ferry's (in place)                        >= 3

    python benchmarks/peers.py [--sizes 512 [4096]] [--rounds 5] [--cold] [--dir D] [--json]
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
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from ferry.engine import AsyncSaver, list_checkpoints, load, save
from ferry.storage import open_storage
from ferry.storage.sweep import swept

TENSORS = 64
GOALS: dict[str, tuple[str, float]] = {
    "sync_save_vs_dcp": (">=", 1.5),
    "async_blocked_vs_memcpy": ("<=", 1.3),
    "async_blocked_vs_dcp_async": ("<=", 1 / 3),
    "load_vs_torch_load": (">=", 1.1),
    "load_into_vs_dcp_load": (">=", 3.0),
}
WRITES = ("ferry_save", "torch_save", "dcp_save", "ferry_async", "dcp_async", "memcpy")
READS = ("ferry_load", "torch_load", "ferry_load_into", "dcp_load")


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def files_under(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    return [os.path.join(d, f) for d, _, names in os.walk(path) for f in names]


def prepare(path: str, cold: bool) -> None:
    """Read every file under ``path`` once (warm), or drop its pages (cold)."""
    for name in files_under(path):
        if cold:
            fd = os.open(name, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        else:
            with open(name, "rb", buffering=0) as f:
                while f.read(16 << 20):
                    pass


def _staging_options(pin: bool) -> StagingOptions:
    return StagingOptions(use_pinned_memory=pin, use_shared_memory=False, use_async_staging=False,
                          use_non_blocking_copy=pin)  # fmt: skip


class Contenders:
    """The contenders of one state size, each writing under its own folder of ``root``."""

    def __init__(self, size_mib: int, root: str) -> None:
        g = torch.Generator().manual_seed(0)
        per = (size_mib << 20) // TENSORS // 4
        self.state = {f"t{i:02d}": torch.randn(per, generator=g) for i in range(TENSORS)}
        self.nbytes = sum(t.nbytes for t in self.state.values())
        self.root = root
        self.paths = {k: os.path.join(root, k) for k in ("ferry", "torch.pt", "dcp", "async", "dcp_async")}
        self.saver = AsyncSaver(self.paths["async"], keep_last=1)
        self.pinned = torch.cuda.is_available()  # pinned staging where this torch can pin
        self.stager = DefaultStager(_staging_options(self.pinned))
        # The in-place loads' targets, and the memcpy's (the writes of a round all come
        # before its reads): one buffer of the state's size fewer, for the 4 GiB state.
        self.into = {k: torch.empty_like(t) for k, t in self.state.items()}
        self.samples: dict[str, list[float]] = {
            k: [] for k in (*WRITES, "ferry_async_total", "dcp_async_total", *READS)
        }

    def close(self) -> None:
        self.saver.close()
        self.stager.close()

    # ------------------------------------------------------------------ writes
    def write(self, key: str, step: int) -> None:
        t0 = time.perf_counter()
        if key == "ferry_save":
            save(self.state, self.paths["ferry"], step=step, keep_last=1)
            self.samples[key].append(time.perf_counter() - t0)
            swept()  # the retired checkpoint's deletion ends before the next contender
            return
        if key == "torch_save":
            with open(self.paths["torch.pt"], "wb") as f:
                torch.save(self.state, f)
                f.flush()
                os.fsync(f.fileno())
        elif key == "dcp_save":
            dcp.save(self.state, checkpoint_id=self.paths["dcp"], no_dist=True)
        elif key == "ferry_async":
            handle = self.saver.save(self.state, step=step)
            self.samples[key].append(time.perf_counter() - t0)
            handle.wait()
            self.samples["ferry_async_total"].append(time.perf_counter() - t0)
            return
        elif key == "dcp_async":
            future = self._dcp_async_save()
            self.samples[key].append(time.perf_counter() - t0)
            future.result()  # type: ignore[union-attr]
            self.samples["dcp_async_total"].append(time.perf_counter() - t0)
            return
        else:  # memcpy
            for k, t in self.state.items():
                np.copyto(self.into[k].numpy(), t.numpy())
        self.samples[key].append(time.perf_counter() - t0)

    def _dcp_async_save(self) -> Any:
        """dcp.async_save's future; a pinned stager that fails on host tensors (torch 2.11's,
        a KeyError in its deepcopy) is replaced by a plain one, once, and the report says so."""
        try:
            return dcp.async_save(self.state, checkpoint_id=self.paths["dcp_async"], no_dist=True,
                                  async_stager=self.stager)  # fmt: skip
        except Exception:
            if not self.pinned:
                raise
        self.stager.close()
        self.pinned = False
        self.stager = DefaultStager(_staging_options(False))
        return self._dcp_async_save()

    # ------------------------------------------------------------------ reads
    def read(self, key: str, cold: bool) -> None:
        newest = list_checkpoints(open_storage(self.paths["ferry"]))[-1].url
        where = {"ferry_load": newest, "ferry_load_into": newest, "torch_load": self.paths["torch.pt"],
                 "dcp_load": self.paths["dcp"]}[key]  # fmt: skip
        prepare(where, cold)
        loads: dict[str, Callable[[], Any]] = {
            "ferry_load": lambda: load(self.paths["ferry"]),
            "torch_load": lambda: torch.load(self.paths["torch.pt"], weights_only=True),
            "ferry_load_into": lambda: load(self.paths["ferry"], into=self.into),
            "dcp_load": lambda: dcp.load(self.into, checkpoint_id=self.paths["dcp"], no_dist=True),
        }
        t0 = time.perf_counter()
        loaded = loads[key]()
        self.samples[key].append(time.perf_counter() - t0)
        del loaded


def run_size(size_mib: int, rounds: int, root: str, cold: bool) -> dict[str, Any]:
    c = Contenders(size_mib, root)
    try:
        for r in range(rounds + 1):  # round 0: warm-up (files created, buffers allocated)
            for i in range(len(WRITES)):
                os.sync()
                c.write(WRITES[(i + r) % len(WRITES)], r)
            for i in range(len(READS)):
                c.read(READS[(i + r) % len(READS)], cold)
            if r == 0:
                for v in c.samples.values():
                    v.clear()
    finally:
        c.close()
    med = {k: statistics.median(v) for k, v in c.samples.items()}
    ratios = {
        "sync_save_vs_dcp": med["dcp_save"] / med["ferry_save"],
        "sync_save_vs_torch_save": med["torch_save"] / med["ferry_save"],
        "async_blocked_vs_memcpy": med["ferry_async"] / med["memcpy"],
        "async_blocked_vs_dcp_async": med["ferry_async"] / med["dcp_async"],
        "load_vs_torch_load": med["torch_load"] / med["ferry_load"],
        "load_into_vs_dcp_load": med["dcp_load"] / med["ferry_load_into"],
    }
    return {
        "size_mib": size_mib,
        "bytes": c.nbytes,
        "median_s": med,
        "samples_s": c.samples,
        "ratios": ratios,
        "goals_met": {k: _meets(k, v) for k, v in ratios.items() if k in GOALS},
        "load_average": os.getloadavg(),
        "pinned_staging": c.pinned,
    }


def _meets(name: str, value: float) -> bool:
    op, goal = GOALS[name]
    return value >= goal if op == ">=" else value <= goal


def report(results: list[dict[str, Any]], rounds: int, cold: bool) -> str:
    lines = [f"{rounds} interleaved rounds, medians; loads {'cold' if cold else 'warm'}; "
             f"pinned staging for dcp.async_save: {all(r['pinned_staging'] for r in results)}"]  # fmt: skip
    for res in results:
        gb = res["bytes"] / 1e9
        load = ", ".join(f"{x:.1f}" for x in res["load_average"])
        lines.append(f"state: {res['bytes'] / 2**20:.0f} MiB of float32 in {TENSORS} tensors "
                     f"(load average at the end: {load})")  # fmt: skip
        for key, value in res["median_s"].items():
            lines.append(f"  {key:<18} {value:8.3f} s  {gb / value:6.2f} GB/s")
        lines.append(f"  {'figure':<28} {'ratio':>7}  goal")
        for name, value in res["ratios"].items():
            if name in GOALS:
                op, goal = GOALS[name]
                met = "yes" if res["goals_met"][name] else "NO"
                lines.append(f"  {name:<28} {value:7.3f}  {op} {goal:.3g} {met}")
            else:
                lines.append(f"  {name:<28} {value:7.3f}  (no goal)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[512], help="state sizes in MiB (default 512)")
    p.add_argument("--rounds", type=int, default=5, help="measured rounds, >= 1 (default 5)")
    p.add_argument("--cold", action="store_true", help="drop each file's pages before it is loaded")
    p.add_argument("--dir", default=None, help="where to write (default: a new temp folder)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(argv)
    if args.rounds < 1 or min(args.sizes) < 1:
        p.error("--rounds and --sizes must be >= 1")
    warnings.filterwarnings("ignore")  # DCP warns that no process group is initialised
    results = []
    for size in args.sizes:
        root = tempfile.mkdtemp(prefix="ferry-peers-", dir=args.dir)
        try:
            results.append(run_size(size, args.rounds, root, args.cold))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(results, indent=2) if args.json else report(results, args.rounds, args.cold))
    return 0


if __name__ == "__main__":
    sys.exit(main())
