"""Checkpoint engine benchmark: ferry against the raw disk and ``torch.save``, as ratios.

The state is a model (big Linear layers) plus its AdamW state, ``--size-mb`` in all. Every
round measures each contender once, interleaved, so drifts of a shared disk hit them all
alike; the figures are medians over the rounds. Ratios, with the goals they are held to:

- sync save throughput / raw ``numpy.tofile`` + fsync of the same bytes     (>= 0.9)
- sync save throughput / ``torch.save`` + fsync                             (>= 1.4)
- async save blocking time / ``torch.save`` blocking time                  (<= 0.05)
- load + apply into the live model / raw ``readinto`` of the same bytes,
  both from a cold page cache (dropped when run as root)                     (>= 0.8)
- checkpoint size on disk / raw bytes                                      (<= 1.01)

Each sync save keeps one checkpoint (``keep_last=1``), as a job does, and every contender
writes over its previous round's bytes: the raw write truncates its file, and the sync
save retires its previous checkpoint, whose bytes ferry deletes in the background once the
save returned (``ferry.storage.sweep``). The save's figure is its time to return; the same
save counted until that deletion ended is reported beside it, without a goal
(``*_with_deletion``). The next contender starts after it.

Reported beside them, without a goal (figures to compare between versions of ferry):

- load into fresh tensors (no live objects) / raw ``readinto``, cold cache
- per-tensor load cost of ``--small-count`` small tensors (100-400 float32 elements,
  the sizes of biases, norms and their optimizer moments), against ``torch.load`` of
  the same tensors

Many tensors (issue 17), with their own goals: ``--many-count`` tensors of 4 KiB (20,000:
78 MiB, the shape of a large optimizer's per-parameter states) and ``--wide-count``
tensors of 512 KiB (200: 100 MiB). The per-tensor cost of a save or load is its time less
the time of the same bytes written (``tofile`` + fsync) or read (``readinto``) raw, over
the count; the async snapshot's is its whole blocking time over the count.

- per-tensor cost of a sync save / an async snapshot / a load into new tensors   (<= 10 us)
- sync save of the many tensors, raw write of the same bytes / save time          (>= 0.5)
- load of the 512 KiB tensors into new tensors, ``torch.load`` time / ferry's time,
  warm (each file read once just before) and cold (each file's pages dropped just
  before with ``posix_fadvise(POSIX_FADV_DONTNEED)``, which needs no root)         (>= 1.0)

Run: ``python benchmarks/engine.py [--size-mb 1024] [--rounds 5] [--small-count 2000]
[--many-count 20000] [--wide-count 200] [--dir D] [--json]``.
The figure summary is printed last.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from ferry.engine import AsyncSaver, list_checkpoints, load, save
from ferry.storage import open_storage
from ferry.storage.sweep import swept

GOALS: dict[str, tuple[str, float]] = {
    "sync_vs_raw_write": (">=", 0.9),
    "sync_vs_torch_save": (">=", 1.4),
    "async_blocking_vs_torch_save": ("<=", 0.05),
    "load_vs_raw_read": (">=", 0.8),
    "file_size_vs_raw": ("<=", 1.01),
    "many_sync_save_vs_raw_write": (">=", 0.5),
    "wide_load_vs_torch_load_warm": (">=", 1.0),
    "wide_load_vs_torch_load_cold": (">=", 1.0),
}
PER_TENSOR_GOAL_US = 10.0
"""The most a save, an async snapshot or a load may cost per tensor, beyond its bytes."""
SMALL_KEYS = ("small_load", "small_torch_load")
CPU_KEYS = ("many_raw_write", "many_sync_save", "many_async_blocking", "many_raw_read", "many_load")
"""Contenders timed on the small tensors: per-tensor figures, not throughput."""


def small_state(count: int) -> dict[str, torch.Tensor]:
    """``count`` float32 tensors of 100 to 400 elements."""
    g = torch.Generator().manual_seed(1)
    return {f"t{i}": torch.randn(100 + (i * 37) % 301, generator=g) for i in range(count)}


def build_state(size_bytes: int, layers: int = 8) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A float32 MLP and AdamW with its moments filled: params are a third of the bytes."""
    width = max(16, int(math.sqrt(size_bytes / (3 * 4 * layers))))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def state_tensors(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = list(model.state_dict().values())
    for s in opt.state_dict()["state"].values():
        out.extend(v for v in s.values() if isinstance(v, torch.Tensor))
    return out


WRITES = ("raw_write", "torch_save", "sync_save", "async_blocking")


def drop_caches() -> bool:
    """Flush dirty pages and drop the page cache; False when not allowed (not root)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def timed(fn: Callable[[], Any]) -> float:
    """Seconds ``fn`` took; what it returned is freed after the clock stopped (a loaded
    state is used, not dropped at once: freeing 20,000 tensors is not the load's cost)."""
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    del result
    return seconds


def file_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))


def run(size_mb: int, rounds: int, root: str, small_count: int = 2000) -> dict[str, Any]:
    model, opt = build_state(size_mb << 20)
    state = {"model": model, "opt": opt, "step": 0}
    tensors = state_tensors(model, opt)
    raw_nbytes = sum(t.numel() * t.element_size() for t in tensors)
    raw_buf = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors]).numpy()
    raw_path = os.path.join(root, "raw.bin")
    torch_path = os.path.join(root, "torch.pt")
    sync_root = os.path.join(root, "sync")
    async_root = os.path.join(root, "async")
    saver = AsyncSaver(async_root, keep_last=1)
    small = small_state(small_count)
    small_root = os.path.join(root, "small")
    small_path = os.path.join(root, "small.pt")
    save(small, small_root, step=0)
    torch.save(small, small_path)

    def raw_write() -> None:
        with open(raw_path, "wb") as f:
            raw_buf.tofile(f)
            f.flush()
            os.fsync(f.fileno())

    def torch_write() -> None:
        with open(torch_path, "wb") as f:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())

    read_buf = bytearray(raw_nbytes)

    def raw_read() -> None:
        with open(raw_path, "rb", buffering=0) as f:
            view, pos = memoryview(read_buf), 0
            while pos < raw_nbytes:
                n = f.readinto(view[pos : pos + (64 << 20)])
                assert n, "raw file ended early"
                pos += n

    samples: dict[str, list[float]] = {
        k: [] for k in (*WRITES, "sync_save_with_deletion", "async_total", "raw_read", "load_apply",
                        "load_fresh", *SMALL_KEYS)
    }  # fmt: skip

    def async_save(r: int) -> None:
        t0 = time.perf_counter()
        handle = saver.save(state, step=r)
        samples["async_blocking"].append(time.perf_counter() - t0)
        handle.wait()
        samples["async_total"].append(time.perf_counter() - t0)

    writes: dict[str, Callable[[int], Any]] = {
        "raw_write": lambda r: raw_write(),
        "torch_save": lambda r: torch_write(),
        "sync_save": functools.partial(sync_save, state, sync_root, samples, "sync_save"),
        "async_blocking": async_save,  # records its own two figures
    }
    reads: dict[str, Callable[[], Any]] = {
        "raw_read": raw_read,
        "load_apply": lambda: load(sync_root, into=state),
        "load_fresh": lambda: load(sync_root),
        "small_load": lambda: load(small_root),
        "small_torch_load": lambda: torch.load(small_path, weights_only=True),
    }
    cold = True
    # Round 0 is a warm-up, not counted: it creates the files each contender then replaces
    # (so every round pays for freeing the previous one's blocks, as a training job does)
    # and allocates the async saver's host buffer once, as a job's first checkpoint does.
    # Each round rotates the order, so no contender always follows the same neighbour.
    for r in range(rounds + 1):
        state["step"] = r
        for i in range(len(WRITES)):
            key = WRITES[(i + r) % len(WRITES)]
            os.sync()
            dt = timed(functools.partial(writes[key], r))
            if key not in ("async_blocking", "sync_save"):
                samples[key].append(dt)
        for i in range(len(reads)):
            key = list(reads)[(i + r) % len(reads)]
            cold = drop_caches() and cold
            samples[key].append(timed(reads[key]))
        gc.collect()
        if r == 0:
            first_async = samples["async_blocking"][0]
            for v in samples.values():
                v.clear()

    newest = list_checkpoints(open_storage(sync_root))[-1]
    ckpt_bytes = file_bytes(newest.url)
    saver.close()
    med = {k: statistics.median(v) for k, v in samples.items()}
    gb = raw_nbytes / 1e9
    ratios = {
        "sync_vs_raw_write": med["raw_write"] / med["sync_save"],
        "sync_with_deletion_vs_raw_write": med["raw_write"] / med["sync_save_with_deletion"],
        "sync_vs_torch_save": med["torch_save"] / med["sync_save"],
        "async_blocking_vs_torch_save": med["async_blocking"] / med["torch_save"],
        "load_vs_raw_read": med["raw_read"] / med["load_apply"],
        "file_size_vs_raw": ckpt_bytes / raw_nbytes,
        "fresh_load_vs_raw_read": med["raw_read"] / med["load_fresh"],
        "small_load_vs_torch_load": med["small_torch_load"] / med["small_load"],
    }
    return {
        "raw_bytes": raw_nbytes,
        "checkpoint_bytes": ckpt_bytes,
        "torch_save_bytes": os.path.getsize(torch_path),
        "rounds": rounds,
        "cold_cache": cold,
        "first_async_save_blocking_s": first_async,
        "load_average": os.getloadavg(),
        "median_s": med,
        "samples_s": samples,
        "small_count": small_count,
        "per_tensor_us": {k: med[k] / small_count * 1e6 for k in SMALL_KEYS},
        "throughput_gbps": {
            k: gb / v for k, v in med.items() if k != "async_blocking" and k not in SMALL_KEYS
        },
        "ratios": ratios,
        "goals_met": {k: _meets(k, v) for k, v in ratios.items() if k in GOALS},
    }


def sync_save(state: Any, root: str, samples: dict[str, list[float]], key: str, r: int) -> None:
    """``ferry.save`` with ``keep_last=1``, as a job saves: its time (``key``), and its time
    with the deletion of the checkpoint it retired, which runs in the background after it
    returns (``key_with_deletion``). The next contender starts once that is done."""
    t0 = time.perf_counter()
    save(state, root, step=r, keep_last=1)
    samples[key].append(time.perf_counter() - t0)
    swept()
    samples[f"{key}_with_deletion"].append(time.perf_counter() - t0)


def evict(path: str) -> None:
    """Drop the page cache of one file (its pages are clean: written and synced before)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path: str) -> None:
    """Read one file through, so that its pages are in the page cache."""
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass


def folder_files(folder: str) -> list[str]:
    return [os.path.join(folder, f) for f in os.listdir(folder)]


def run_many(rounds: int, root: str, many_count: int, wide_count: int) -> dict[str, Any]:
    """The many-tensor rows: ``many_count`` tensors of 4 KiB saved (sync and async) and
    loaded, against the raw write and read of the same bytes; ``wide_count`` tensors of
    512 KiB loaded into new tensors, against ``torch.load``, warm and cold."""
    g = torch.Generator().manual_seed(2)
    many = {f"m{i}": torch.randn(1024, generator=g) for i in range(many_count)}
    wide = {f"w{i}": torch.randn(128 << 10, generator=g) for i in range(wide_count)}
    many_bytes = many_count * 4096
    raw_buf = torch.cat(list(many.values())).view(torch.uint8).numpy()
    raw_path = os.path.join(root, "many-raw.bin")
    many_root = os.path.join(root, "many")
    saver = AsyncSaver(os.path.join(root, "many-async"), keep_last=1)
    wide_root = os.path.join(root, "wide")
    wide_pt = os.path.join(root, "wide.pt")
    save(wide, wide_root, step=0)
    with open(wide_pt, "wb") as f:
        torch.save(wide, f)
    os.sync()
    wide_ferry = folder_files(list_checkpoints(open_storage(wide_root))[-1].url)
    read_buf = bytearray(many_bytes)

    def raw_write() -> None:
        with open(raw_path, "wb") as f:
            raw_buf.tofile(f)
            f.flush()
            os.fsync(f.fileno())

    def raw_read() -> None:
        with open(raw_path, "rb", buffering=0) as f:
            view, pos = memoryview(read_buf), 0
            while pos < many_bytes:
                n = f.readinto(view[pos:])
                assert n, "raw file ended early"
                pos += n

    samples: dict[str, list[float]] = {
        k: [] for k in ("many_raw_write", "many_sync_save", "many_sync_save_with_deletion",
                        "many_async_blocking", "many_raw_read",
                        "many_load", "wide_load_warm", "wide_torch_load_warm", "wide_load_cold",
                        "wide_torch_load_cold")
    }  # fmt: skip

    # CPU seconds (every thread of this process) beside the wall times: on a shared machine
    # the wall time of a Python loop grows with the load, its CPU time much less.
    cpu: dict[str, list[float]] = {k: [] for k in CPU_KEYS}

    def async_save(r: int) -> None:
        c0, t0 = time.process_time(), time.perf_counter()
        handle = saver.save(many, step=r)
        samples["many_async_blocking"].append(time.perf_counter() - t0)
        cpu["many_async_blocking"].append(time.process_time() - c0)
        handle.wait()

    def many_read(fn: Callable[[], Any], files: Callable[[], list[str]], key: str) -> Callable[[], float]:
        # Warm, like a job that has just written its checkpoint: the files read once first.
        def go() -> float:
            for path in files():
                warm(path)
            c0, t0 = time.process_time(), time.perf_counter()
            result = fn()
            dt = time.perf_counter() - t0
            cpu[key].append(time.process_time() - c0)
            del result  # (freed after the clocks stopped, as in ``timed``)
            return dt

        return go

    def wide_read(fn: Callable[[], Any], files: list[str], cold: bool) -> Callable[[], float]:
        def go() -> float:
            for path in files:
                (evict if cold else warm)(path)
            return timed(fn)

        return go

    def many_files() -> list[str]:
        return folder_files(list_checkpoints(open_storage(many_root))[-1].url)

    writes: dict[str, Callable[[int], Any]] = {
        "many_raw_write": lambda r: raw_write(),
        "many_sync_save": functools.partial(sync_save, many, many_root, samples, "many_sync_save"),
        "many_async_blocking": async_save,  # records its own figure
    }
    reads: dict[str, Callable[[], float]] = {
        "many_raw_read": many_read(raw_read, lambda: [raw_path], "many_raw_read"),
        "many_load": many_read(lambda: load(many_root), many_files, "many_load"),
        "wide_load_warm": wide_read(lambda: load(wide_root), wide_ferry, cold=False),
        "wide_torch_load_warm": wide_read(
            lambda: torch.load(wide_pt, weights_only=True), [wide_pt], cold=False
        ),
        "wide_load_cold": wide_read(lambda: load(wide_root), wide_ferry, cold=True),
        "wide_torch_load_cold": wide_read(
            lambda: torch.load(wide_pt, weights_only=True), [wide_pt], cold=True
        ),
    }
    for r in range(rounds + 1):  # round 0: warm-up, as in run()
        for i in range(len(writes)):
            key = list(writes)[(i + r) % len(writes)]
            os.sync()
            c0 = time.process_time()
            dt = timed(functools.partial(writes[key], r))
            if key not in ("many_async_blocking", "many_sync_save"):
                samples[key].append(dt)
            if key != "many_async_blocking":
                cpu[key].append(time.process_time() - c0)
        for i in range(len(reads)):
            key = list(reads)[(i + r) % len(reads)]
            samples[key].append(reads[key]())
        gc.collect()
        if r == 0:
            for v in (*samples.values(), *cpu.values()):
                v.clear()
    saver.close()
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    med = {k: statistics.median(v) for k, v in samples.items()}
    per_tensor_us = {
        "sync_save": (med["many_sync_save"] - med["many_raw_write"]) / many_count * 1e6,
        "async_snapshot": med["many_async_blocking"] / many_count * 1e6,
        "load": (med["many_load"] - med["many_raw_read"]) / many_count * 1e6,
    }
    cpu_per_tensor_us = {
        "sync_save": (cpu_med["many_sync_save"] - cpu_med["many_raw_write"]) / many_count * 1e6,
        "async_snapshot": cpu_med["many_async_blocking"] / many_count * 1e6,
        "load": (cpu_med["many_load"] - cpu_med["many_raw_read"]) / many_count * 1e6,
    }
    ratios = {
        "many_sync_save_vs_raw_write": med["many_raw_write"] / med["many_sync_save"],
        "many_sync_save_with_deletion_vs_raw_write": (
            med["many_raw_write"] / med["many_sync_save_with_deletion"]
        ),
        "wide_load_vs_torch_load_warm": med["wide_torch_load_warm"] / med["wide_load_warm"],
        "wide_load_vs_torch_load_cold": med["wide_torch_load_cold"] / med["wide_load_cold"],
    }
    return {
        "many_count": many_count,
        "wide_count": wide_count,
        "median_s": med,
        "samples_s": samples,
        "per_tensor_us": per_tensor_us,
        "cpu_per_tensor_us": cpu_per_tensor_us,
        "load_average": os.getloadavg(),
        "per_tensor_met": {k: v <= PER_TENSOR_GOAL_US for k, v in per_tensor_us.items()},
        "ratios": ratios,
        "goals_met": {k: _meets(k, v) for k, v in ratios.items() if k in GOALS},
    }


def _meets(name: str, value: float) -> bool:
    op, goal = GOALS[name]
    return value >= goal if op == ">=" else value <= goal


def report(res: dict[str, Any]) -> str:
    lines = report_main(res) if "median_s" in res else []
    if "many" in res:
        lines.extend(report_many(res["many"]))
    return "\n".join(lines)


def report_main(res: dict[str, Any]) -> list[str]:
    med, gbps = res["median_s"], res["throughput_gbps"]
    lines = [f"state: {res['raw_bytes'] / 2**20:.0f} MiB of tensors; checkpoint "
             f"{res['checkpoint_bytes'] / 2**20:.1f} MiB; torch.save file "
             f"{res['torch_save_bytes'] / 2**20:.1f} MiB; {res['rounds']} rounds, medians"]  # fmt: skip
    timed_keys = ("raw_write", "torch_save", "sync_save", "async_total", "raw_read", "load_apply")
    for key in (*timed_keys, "load_fresh"):
        lines.append(f"  {key:<16} {med[key]:8.3f} s  {gbps[key]:6.2f} GB/s")
    for key in SMALL_KEYS:
        lines.append(
            f"  {key:<16} {med[key]:8.3f} s  {res['per_tensor_us'][key]:6.1f} us per tensor "
            f"({res['small_count']} tensors)"
        )
    first = res["first_async_save_blocking_s"]
    blocked = med["async_blocking"]
    lines.append(
        f"  {'async_blocking':<16} {blocked:8.3f} s  (first save, allocating its buffer: {first:.3f} s)"
    )
    lines.append(f"  machine load average at the end: {', '.join(f'{x:.2f}' for x in res['load_average'])}")
    if not res["cold_cache"]:
        lines.append("  NOTE: page cache could not be dropped (not root): reads were WARM")
    lines.append("")
    lines.append("figure                              ratio    goal     met")
    for name, value in res["ratios"].items():
        if name not in GOALS:
            lines.append(f"{name:<34} {value:7.3f}  (no goal)")
            continue
        op, goal = GOALS[name]
        lines.append(f"{name:<34} {value:7.3f}  {op} {goal:<5} "
                     f"{'yes' if res['goals_met'][name] else 'NO'}")  # fmt: skip
    lines.append("")
    return lines


def report_many(many: dict[str, Any]) -> list[str]:
    lines = [f"many tensors: {many['many_count']} x 4 KiB saved and loaded; "
             f"{many['wide_count']} x 512 KiB loaded into new tensors; medians"]  # fmt: skip
    for key, value in many["median_s"].items():
        lines.append(f"  {key:<28} {value:8.3f} s")
    lines.append("")
    lines.append("figure                                      ratio    goal     met")
    for name, value in many["ratios"].items():
        if name not in GOALS:
            lines.append(f"{name:<42} {value:7.3f}  (no goal)")
            continue
        op, goal = GOALS[name]
        lines.append(f"{name:<42} {value:7.3f}  {op} {goal:<5} {'yes' if many['goals_met'][name] else 'NO'}")
    load = ", ".join(f"{x:.1f}" for x in many["load_average"])
    lines.append(f"per-tensor cost (us; CPU of every thread beside it; load average {load})")
    for name, value in many["per_tensor_us"].items():
        met = "yes" if many["per_tensor_met"][name] else "NO"
        cpu = many["cpu_per_tensor_us"][name]
        lines.append(f"{name:<42} {value:7.2f}  <= {PER_TENSOR_GOAL_US:<5} {met:<4} CPU {cpu:6.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mb", type=int, default=1024, help="state size in MiB (default 1024)")
    p.add_argument("--rounds", type=int, default=5, help="measured rounds, >= 1 (default 5)")
    p.add_argument("--small-count", type=int, default=2000, help="small tensors timed (default 2000)")
    p.add_argument(
        "--many-count", type=int, default=20000, help="4 KiB tensors saved and loaded (default 20000)"
    )
    p.add_argument("--wide-count", type=int, default=200, help="512 KiB tensors loaded (default 200)")
    p.add_argument("--many-only", action="store_true", help="only the many-tensor rows")
    p.add_argument("--dir", default=None, help="where to write (default: a new temp folder)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(argv)
    if min(args.rounds, args.size_mb, args.small_count, args.many_count, args.wide_count) < 1:
        p.error("--rounds, --size-mb, --small-count, --many-count and --wide-count must be >= 1")
    try:
        if args.dir is not None:
            os.makedirs(args.dir, exist_ok=True)
        root = tempfile.mkdtemp(prefix="ferry-bench-", dir=args.dir)
    except OSError as exc:
        p.error(f"--dir {args.dir}: cannot make a folder to write in there: {exc.strerror}")
    try:
        res = {} if args.many_only else run(args.size_mb, args.rounds, root, args.small_count)
        res["many"] = run_many(args.rounds, root, args.many_count, args.wide_count)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
