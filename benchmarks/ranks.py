"""Multi-rank jobs under torchrun (2 ranks, gloo, CPU): what a save blocks, what agreeing
costs, how fast a stop ends every rank.

1. Training blocked by a save: each rank holds ``--mib`` MiB of parameters (4 MiB tensors,
   updated by an SGD optimizer whose steps find no gradients, so they change nothing and
   cost nothing) and trains in steps of 20 ms (``--save-step-ms``) with a checkpoint due
   every 10 steps. The blocked time is the saving step's safe point plus the next
   optimizer step's wait for the copies that ``overlap_snapshot`` left running, the
   longest over the ranks (after one untimed save of each kind: the host buffer of the
   snapshots is allocated once, then reused). Three kinds of save take turns, each
   waiting for the previous commit: asynchronous (the default), asynchronous with
   ``overlap_snapshot``, synchronous.
   Goal: median async / median sync <= 0.1; the overlap's ratio is reported beside it.
2. Per-step overhead of the ranks' agreement: data-parallel steps of 5, 20 and 100 ms
   (a sleep, the same length on both ranks on a shared machine, then a gradient
   all-reduce of 4 KiB and the optimizer's step), nothing due: plain (no ferry); under
   ferry with the agreement off (its safe point every step, the ranks never agreeing) and
   on (as scheduled); and plain with one more gloo all-reduce per step (how ferry agreed
   before), timed in short chunks of each kind in turn (0.3-0.5 s each; 8, 6 and 3 chunks
   a round: the shorter the step, the noisier a chunk). Goal: agreement on / off <= 1.01.
3. Stop latency: a fresh job per round; after a warm-up (a first save committed) SIGUSR1
   goes to rank 1 alone; the time until every rank has exited, each with 85.

Rounds interleave the variants (each round runs every variant once, in rotating order) so
that all see the same machine noise; figures are medians over the rounds.

    python benchmarks/ranks.py [--rounds 5] [--mib 256] [--save-step-ms 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = r'''
import json, os, sys, time
import torch, torch.distributed as dist
import ferry
from ferry.session.api import current

mode, out, mib, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
SAVE_STEP = float(sys.argv[5]) if len(sys.argv) > 5 else 0.02  # part 1's step, seconds
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
model = torch.nn.ParameterList(torch.randn(1 << 20) for _ in range(max(1, mib // 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no gradients: its step changes nothing
ferry.configure(keep_last=1, overlap_snapshot=True)
ferry.track(model=model, opt=opt)
session = current()
assert session is not None
overlap = session.checkpointer.overlap


def settle():
    """Both ranks at the same point, nothing in flight: outside every timed region."""
    session.checkpointer.wait()
    dist.barrier()


def longest(values):
    t = torch.tensor([max(values)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def saving(kind):
    """The time the saving step blocks training, the longest over the ranks: its safe point,
    and the next optimizer step's wait for the copies the overlap left running."""
    session.config.every_steps = None  # the object the session's parts share
    while (session.global_step + 1) % 10:
        train_step(SAVE_STEP)
        ferry.step()
    settle()
    overlap.on = kind == "overlap"
    session.config.every_steps, session.config.async_save = 10, kind != "sync"
    train_step(SAVE_STEP)
    t0 = time.perf_counter()
    ferry.step()  # the 10th: a checkpoint is due
    at_safe_point = time.perf_counter() - t0
    waited = train_step(SAVE_STEP)
    blocked = longest([at_safe_point + waited])
    assert session.global_step % 10 == 0
    settle()
    return blocked


GRAD = torch.zeros(1024)


def train_step(dt):
    """A data-parallel step: compute (a sleep, the same length on both ranks whatever the
    machine's load), the gradients' all-reduce that keeps the ranks in step, the optimizer's
    step. Returns the time the optimizer step took."""
    time.sleep(dt)
    dist.all_reduce(GRAD)
    t0 = time.perf_counter()
    opt.step()
    return time.perf_counter() - t0


FLAG = torch.zeros(2, dtype=torch.int64)


def never(*args, **kwargs):
    return False


def chunk(kind, dt, steps):
    """``steps`` steps of one kind, timed; the longest over the ranks."""
    if kind == "ferry-off":  # the session's safe points, never an agreement
        session.checkpointer.may_agree_at = never
    settle()
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step(dt)
        if kind in ("ferry", "ferry-off"):
            ferry.step()
        elif kind == "allreduce":
            dist.all_reduce(FLAG, op=dist.ReduceOp.MAX)
    seconds = longest([time.perf_counter() - t0])
    vars(session.checkpointer).pop("may_agree_at", None)
    return seconds


if mode == "measure":
    saves = ["async", "overlap", "sync"]
    results = {"steps": {}, **{kind: [] for kind in saves}}
    for kind in saves:  # warm-up: the snapshot buffer is allocated once, then reused
        saving(kind)
    kinds = ["plain", "ferry-off", "ferry", "allreduce"]
    for r in range(rounds):
        for kind in saves[r % 3 :] + saves[: r % 3]:
            results[kind].append(saving(kind))
        overlap.on = False
        session.config.every_steps = None  # the object the session's parts share
        for dt, steps, chunks in ((0.005, 60, 8), (0.020, 20, 6), (0.100, 5, 3)):
            chunk("ferry", dt, 20)  # warm-up: ferry measures the pace of agreeing again
            totals = dict.fromkeys(kinds, 0.0)
            for c in range(chunks):  # short chunks, the kinds in turn: the same machine noise
                for kind in kinds[(r + c) % 4 :] + kinds[: (r + c) % 4]:
                    totals[kind] += chunk(kind, dt, steps)
            for kind in kinds:
                per_step = totals[kind] / (steps * chunks)
                results["steps"].setdefault(f"{dt}", {}).setdefault(kind, []).append(per_step)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
else:  # stop: train until a stop signal; say when warm
    session.config.every_steps = 10
    try:
        while True:
            train_step(0.02)
            ferry.step()
            if session.global_step == 12 and rank == 1:
                session.checkpointer.wait()
                open(out + ".warm", "w").close()
    except SystemExit as stop:
        with open(f"{out}.exit{rank}", "w") as f:
            f.write(str(stop.code))
        raise
'''


def torchrun(script: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    launcher = str(Path(sys.executable).parent / "torchrun")
    cmd = [launcher, "--standalone", "--nproc_per_node", "2", script, *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def ranks_of(agent: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == agent:
                kids.append(int(entry.name))
    return kids


def gone(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) == "Z"
    except OSError:
        return True


def stop_latency(script: str, tmp: str, mib: int, r: int, env: dict[str, str]) -> float:
    out = os.path.join(tmp, f"stop{r}")
    ck = os.path.join(tmp, f"ck-stop{r}")
    job = torchrun(script, ["stop", out, str(mib), "1"], dict(env, FERRY_DIR=ck))
    deadline = time.monotonic() + 300
    while not os.path.exists(out + ".warm"):
        if job.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the stop job ended early: {job.communicate()[1].decode()[-2000:]}")
        time.sleep(0.01)
    ranks = ranks_of(job.pid)
    one = [p for p in ranks if b"RANK=1" in Path(f"/proc/{p}/environ").read_bytes().split(b"\0")]
    t0 = time.perf_counter()
    os.kill(one[0], signal.SIGUSR1)
    while not all(gone(p) for p in ranks):
        time.sleep(0.002)
    seconds = time.perf_counter() - t0
    job.communicate(timeout=120)
    codes = [Path(f"{out}.exit{rank}").read_text() for rank in (0, 1)]
    if codes != ["85", "85"]:
        raise SystemExit(f"the ranks of the stop job exited with {codes}, not 85")
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--mib", type=int, default=256, help="state per rank")
    p.add_argument("--save-step-ms", type=float, default=20.0, help="the step of part 1 (saves)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="ferry-ranks-") as tmp:
        script = os.path.join(tmp, "worker.py")
        Path(script).write_text(WORKER)
        env = dict(os.environ, FERRY_HOME=os.path.join(tmp, "home"), OMP_NUM_THREADS="1",
                   FERRY_DIR=os.path.join(tmp, "ck"))  # fmt: skip
        out = os.path.join(tmp, "measure.json")
        job = torchrun(
            script, ["measure", out, str(args.mib), str(args.rounds), str(args.save_step_ms / 1e3)], env
        )
        _, err = job.communicate(timeout=3600)
        if job.returncode != 0:
            raise SystemExit(f"the measuring job failed ({job.returncode}): {err.decode()[-3000:]}")
        measured = json.loads(Path(out).read_text())
        stops = [stop_latency(script, tmp, args.mib, r, env) for r in range(args.rounds)]
    med = statistics.median
    steps = {dt: {kind: med(v) * 1e3 for kind, v in kinds.items()} for dt, kinds in measured["steps"].items()}
    result = {
        "rounds": args.rounds,
        "mib_per_rank": args.mib,
        "save_step_ms": args.save_step_ms,
        "blocked_async_s": med(measured["async"]),
        "blocked_sync_s": med(measured["sync"]),
        "blocked_ratio": med(measured["async"]) / med(measured["sync"]),
        "blocked_overlap_s": med(measured["overlap"]),
        "blocked_overlap_ratio": med(measured["overlap"]) / med(measured["sync"]),
        "blocked_goal": 0.1,
        "step_ms": steps,
        "agreement_ratio": {dt: s["ferry"] / s["ferry-off"] for dt, s in steps.items()},
        "ferry_ratio": {dt: s["ferry"] / s["plain"] for dt, s in steps.items()},
        "allreduce_every_step_ratio": {dt: s["allreduce"] / s["plain"] for dt, s in steps.items()},
        "agreement_goal": 1.01,
        "stop_to_all_exited_s": med(stops),
        "stop_rounds_s": stops,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"state per rank {args.mib} MiB, 2 ranks, {args.rounds} rounds (medians); "
          f"saves in steps of {args.save_step_ms:g} ms")  # fmt: skip
    print(f"training blocked by a save: async {result['blocked_async_s']:.3f} s, async with "
          f"overlap_snapshot {result['blocked_overlap_s']:.3f} s, "
          f"sync {result['blocked_sync_s']:.3f} s")  # fmt: skip
    for dt, s in steps.items():
        print(f"step {float(dt) * 1e3:.0f} ms: plain {s['plain']:.3f} ms; ferry, agreement off "
              f"{s['ferry-off']:.3f} ms, on {s['ferry']:.3f} ms (on/off x{s['ferry'] / s['ferry-off']:.4f}, "
              f"on/plain x{s['ferry'] / s['plain']:.4f}); all-reduce every step {s['allreduce']:.3f} ms "
              f"(x{s['allreduce'] / s['plain']:.4f})")  # fmt: skip
    print(f"stop signal on rank 1 -> every rank exited 85: {result['stop_to_all_exited_s']:.3f} s "
          f"(rounds: {', '.join(f'{s:.2f}' for s in stops)})")  # fmt: skip
    worst = max(result["agreement_ratio"].values())
    print(f"blocked async/sync {result['blocked_ratio']:.3f} (goal <= 0.1), with overlap_snapshot "
          f"{result['blocked_overlap_ratio']:.3f}; "
          f"agreement overhead worst x{worst:.4f} (goal <= 1.01)")  # fmt: skip


if __name__ == "__main__":
    main()
