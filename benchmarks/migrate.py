"""Migration downtime benchmark: warm migration (the target worker starts beside the old one)
against the restart it replaces, on real ``ferry run`` jobs moved with ``ferry migrate``.

A job is an MLP with AdamW on the CPU, sized so that its state (parameters and both moments)
is ``--size-mb`` (default: one job of 80 MiB and one of 1024 MiB), trained under
``ferry run --max-restarts N`` in explicit mode. Each round moves it twice warm (to devices 1,
then back to 0) and twice cold (``--cold``), interleaved, so that the load of a shared
machine hits both alike; figures are medians over ``--rounds`` (at least 5) migrations of
each kind. ``ferry migrate --json`` reports each migration's parts, measured in the same run
(docs/cli.md): drain (to the next safe point), save, hand-over, restore, first step.

    warm downtime / (drain + save + restore) of the same migration        (goal <= 1.3)
    warm downtime (s), 80 MiB job                                          (goal <= 1.0)

With ``--nodes``, the same jobs also move between nodes the way two nodes would, here two
job directories on one machine: ``ferry export`` stops the job and writes a bundle, and the
job goes on as a new job that ``ferry resume`` starts from it, cold (after the export) or warm
(``--warm``: its worker waits at its restore point before the export begins). Each round
moves the job once each way, each move to a new job; the downtime runs from the export's
stop request to the new worker's resume, plus its first step's warm-up, from the bundle's
times and the new job's events, for both kinds alike. Printed: warm downtime / (drain +
save + export + restore) and warm / cold.

Reported beside them, without a goal: the cold downtime (with its first step's warm-up, as
the warm one has it) and warm / cold, and the warm worker's start-up hidden behind training.
The first step counts only as far as it took longer than the second (docs/cli.md).
CUDA_VISIBLE_DEVICES only changes a CPU job's environment: the devices are not checked
(``--unchecked-devices``).

Run: ``python benchmarks/migrate.py [--size-mb 80 --size-mb 1024] [--rounds 5] [--nodes]
[--dir D] [--json]``. The figure summary is printed last.
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
import threading
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


class Started:
    """A ``ferry run`` or ``ferry resume`` in the background, its stderr collected by a thread."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        if self.proc.stderr is not None:
            for line in self.proc.stderr:
                self.lines.append(line)

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(300)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def wait_for(what: str, ready: Any, started: Started, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if started.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what}: gave up; it said:\n{''.join(started.lines)[-3000:]}")
        time.sleep(0.1)


def measure(root: str, size_mb: int, rounds: int) -> dict[str, Any]:
    job = f"bench-{size_mb}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env.update(FERRY_HOME=os.path.join(root, "home"), PYTHONWARNINGS="ignore")
    argv = [*FERRY, "run", "--no-autotrack", "--job-id", job, "--dir", os.path.join(root, f"ck-{size_mb}"),
            "--max-restarts", str(4 * rounds + 1), "--keep-last", "2", "--env", "CUDA_VISIBLE_DEVICES=0",
            "--", sys.executable, os.path.abspath(__file__), "--child", str(size_mb)]  # fmt: skip
    started = Started(argv, env)
    warm: list[dict[str, Any]] = []
    cold: list[dict[str, Any]] = []
    try:
        wait_for("the job's start", lambda: training(env, job), started)
        for _ in range(rounds):
            for to, kind in (("1", "warm"), ("0", "cold"), ("1", "cold"), ("0", "warm")):
                extra = ["--cold"] if kind == "cold" else []
                doc = ferry(env, "migrate", job, "--to", to, "--unchecked-devices", "--json", *extra)
                if doc["warm"] != (kind == "warm"):
                    raise RuntimeError(f"a {kind} migration went {'warm' if doc['warm'] else 'cold'}: {doc}")
                (warm if kind == "warm" else cold).append(doc)
                print(f"  {size_mb} MiB {kind}: downtime {doc['downtime']:.3f} s", file=sys.stderr)
    finally:
        started.stop()
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


# ---------------------------------------------------------------------- moves between nodes
def events(env: dict[str, str], job: str) -> list[dict[str, Any]]:
    path = os.path.join(env["FERRY_HOME"], "jobs", job, "events.jsonl")
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def node_move(env: dict[str, str], job: str, bundle: str) -> dict[str, float]:
    """The move that made ``job`` from ``bundle``, once it took two steps: its parts (s)."""
    with open(os.path.join(bundle, "bundle.json")) as f:
        b = json.load(f)
    evs = events(env, job)
    resume = [e for e in evs if e["event"] == "resume"][-1]
    first = [e for e in evs if e["event"] == "first_step"][-1]
    parts = {
        "drain": b["committed"] - b["save_seconds"] - b["stop_requested"],
        "save": b["save_seconds"],
        "export": b["created"] - b["committed"],
        "start": resume["time"] - resume["seconds"] - b["created"],  # warm: the fetch alone
        "restore": resume["seconds"],
        "first_step": max(0.0, first["seconds"] - first["next_seconds"]),
    }
    parts = {k: max(0.0, v) for k, v in parts.items()}
    parts["downtime"] = sum(parts.values())
    return parts


def measure_nodes(root: str, size_mb: int, rounds: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env.update(FERRY_HOME=os.path.join(root, f"home-nodes-{size_mb}"), PYTHONWARNINGS="ignore")
    child_cmd = ["--", sys.executable, os.path.abspath(__file__), "--child", str(size_mb)]
    n = 0

    def where(k: int) -> list[str]:
        return ["--job-id", f"node-{size_mb}-{k}", "--dir", os.path.join(root, f"ck-node-{size_mb}-{k}")]

    def has_trained(job: str) -> bool:
        return training(env, job) and any(e["event"] == "first_step" for e in events(env, job))

    current = Started([*FERRY, "run", "--no-autotrack", *where(0), *child_cmd], env)
    wait_for("the first job's start", lambda: training(env, f"node-{size_mb}-0"), current)
    moves: dict[str, list[dict[str, float]]] = {"warm": [], "cold": []}
    try:
        for r in range(rounds):
            for kind in ("warm", "cold") if r % 2 == 0 else ("cold", "warm"):
                bundle = os.path.join(root, f"bundle-{size_mb}-{n + 1}")
                old, job = f"node-{size_mb}-{n}", f"node-{size_mb}-{n + 1}"
                if kind == "warm":
                    nxt = Started(
                        [*FERRY, "resume", bundle, "--warm", "--no-autotrack", *where(n + 1), *child_cmd], env
                    )
                    wait_for("the warm worker", lambda s=nxt: s.said("waits at its restore point"), nxt)
                    ferry(env, "export", old, bundle, "--json")
                else:
                    ferry(env, "export", old, bundle, "--json")
                    nxt = Started([*FERRY, "resume", bundle, *where(n + 1)], env)
                current.proc.wait(300)
                current, n = nxt, n + 1
                wait_for(f"job {job}'s first steps", lambda j=job: has_trained(j), current)
                move = node_move(env, job, bundle)
                moves[kind].append(move)
                print(
                    f"  {size_mb} MiB between nodes, {kind}: downtime {move['downtime']:.3f} s",
                    file=sys.stderr,
                )
    finally:
        current.stop()
    med = statistics.median
    keys = ("drain", "save", "export", "start", "restore", "first_step", "downtime")
    warm, cold = moves["warm"], moves["cold"]
    ratio = [m["downtime"] / (m["drain"] + m["save"] + m["export"] + m["restore"]) for m in warm]
    return {
        "size_mb": size_mb,
        "moves": {"warm": len(warm), "cold": len(cold)},
        "warm": {k: med(m[k] for m in warm) for k in keys},
        "cold": {k: med(m[k] for m in cold) for k in keys},
        "warm_vs_drain_save_export_restore": med(ratio),
        "warm_vs_cold": med(m["downtime"] for m in warm) / med(m["downtime"] for m in cold),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, action="append", help="state size of a job (repeatable)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of 2 warm + 2 cold moves (>= 3)")
    p.add_argument("--nodes", action="store_true", help="also move each job between nodes (export, resume)")
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
        nodes = [measure_nodes(root, size, max(args.rounds, 3) * 2) for size in sizes] if args.nodes else []
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps({"migrate": results, "nodes": nodes}, indent=1))
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
    for r in nodes:
        w, c = r["warm"], r["cold"]
        print(
            f"{r['size_mb']} MiB state between nodes (export, resume), medians of "
            f"{r['moves']['warm']} warm and {r['moves']['cold']} cold moves:\n"
            f"  warm downtime {w['downtime']:.3f} s = drain {w['drain']:.3f} + save {w['save']:.3f} + export "
            f"{w['export']:.3f} + fetch {w['start']:.3f} + restore {w['restore']:.3f} + first step "
            f"{w['first_step']:.3f}\n"
            f"  cold downtime {c['downtime']:.3f} s = drain {c['drain']:.3f} + save {c['save']:.3f} + export "
            f"{c['export']:.3f} + fetch and start {c['start']:.3f} + restore {c['restore']:.3f} + first step "
            f"{c['first_step']:.3f}"
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
    for r in nodes:
        print(
            f"  {r['size_mb']} MiB between nodes: warm downtime / (drain + save + export + restore) "
            f"{r['warm_vs_drain_save_export_restore']:.2f}; warm / cold downtime {r['warm_vs_cold']:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
