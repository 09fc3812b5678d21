"""gpu_proof.sh, the process part: ``ferry process suspend`` and ``ferry process wake`` of a
process that holds ~15 GB of GPU memory and keeps computing, through the CLI (``--json``), as an
operator runs them; ``ferry process state`` in each state (running, locked, checkpointed, running again);
the preflight's messages (what the suspend warns about; a wake onto a GPU that is not here;
a wake onto a GPU whose memory was taken meanwhile).

Goals: suspend and wake each <= 10 s (the driver steps, as ``--json`` reports them; the
command's wall time beside it); the GPU memory released while suspended; the process's data
unchanged and its work going on after the wake. Where the driver's checkpoint API is not
usable (an old driver; gVisor, whose GPU proxy may not pass these calls) each row says
UNAVAILABLE, with the driver's answer.

    python suspend.py [--gb 15]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from common import SMALL, plan, row, say, verdict, why_no_cuda

PART = "process"
CHECKS = (
    "suspend (lock + checkpoint) of a process holding GPU memory",
    "wake (restore + unlock)",
    "process state in every state",
    "GPU memory released while suspended, given back on wake",
    "the process's data unchanged, its work goes on after the wake",
    "preflight: suspend warnings as /proc shows the process",
    "preflight: wake onto a GPU that is not here is refused",
    "preflight: wake without room on the GPU is refused, process kept",
)
CALL_SECONDS = 40
"""The longest a ferry command may take (the part's timeout is 90 s)."""
FERRY = [sys.executable, "-c", "import sys; from ferry.cli import main; sys.argv[0] = 'ferry'; main()"]
HOLDER = r"""
import hashlib, select, sys, time, torch
x = torch.empty(int(sys.argv[1]) // 8, dtype=torch.int64, device="cuda")
x.random_()  # from the CUDA generator: ~15 GB of random words
def digest():  # the sums of each 4 KiB row and of each column of rows: any change of a word shows
    rows = x.view(-1, 512)
    sums = rows.sum(dim=1).cpu().numpy().tobytes() + rows.sum(dim=0).cpu().numpy().tobytes()
    return hashlib.sha256(sums).hexdigest()
print("ready", digest(), flush=True)
a = torch.randn(1024, 1024, device="cuda")
tick = 0
while True:
    a = torch.tanh(a @ a / 32)  # work on the GPU, each tick
    torch.cuda.synchronize()
    tick += 1
    print("tick", tick, flush=True)
    ready, _, _ = select.select([sys.stdin], [], [], 0.05)
    if ready:
        line = sys.stdin.readline().strip()
        if line == "digest":
            print("digest", digest(), flush=True)
        else:
            break
"""


class Holder:
    """The process under test: knows nothing of ferry; holds the memory, ticks, says its digest.
    A thread reads its lines: ticks count, the others wait in a queue."""

    def __init__(self, nbytes: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(nbytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.ticks = 0
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        first = self._line(120)
        if not first.startswith("ready"):
            raise RuntimeError(f"the holder did not start: {first!r}")
        self.digest = first.split()[1]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("tick"):
                self.ticks = int(line.split()[1])
            else:
                self._lines.put(line.strip())
        self._lines.put(f"(exited {self.proc.wait()})")

    def _line(self, timeout: float) -> str:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            return "(no answer)"

    def drain(self, seconds: float) -> int:
        """The last tick seen after ``seconds``."""
        time.sleep(seconds)
        return self.ticks

    def ask_digest(self) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write("digest\n")
        line = self._line(60)
        return line.split()[1] if line.startswith("digest") else line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def ferry(*args: str) -> tuple[int, dict[str, Any], str, float]:
    """A ferry command with ``--json``: (exit code, its JSON, its error or stderr, wall seconds).
    With ``--json`` an error is a JSON object too: ``{"error": ..., "exit": ...}``."""
    t0 = time.perf_counter()
    try:
        out = subprocess.run([*FERRY, *args, "--json"], capture_output=True, text=True, timeout=CALL_SECONDS)
    except subprocess.TimeoutExpired:  # a driver call that hangs: an answer too
        out = subprocess.CompletedProcess(args, 124, "", f"no answer in {CALL_SECONDS} s (killed)")
    wall = time.perf_counter() - t0
    try:
        doc = json.loads(out.stdout)
    except json.JSONDecodeError:
        doc = {}
    err = str(doc.get("error") or out.stderr.strip())
    said = f"; {err[-300:]}" if err else ""
    say(f"ferry {' '.join(args)} --json: exit {out.returncode} in {wall:.2f} s{said}")
    return out.returncode, doc if out.returncode == 0 else {}, err, wall


def runtime() -> str:
    """gVisor or not: gVisor's kernel says 4.4.0, which no kernel that runs a driver of r570 or
    newer does."""
    release = os.uname().release
    return "gVisor" if release.startswith("4.4.0") else f"Linux {release}"


def unavailable(reason: str) -> None:
    for check in CHECKS:
        row(PART, check, "-", "-", "UNAVAILABLE", reason)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gb", type=float, default=0.0625 if SMALL else 15.0)
    args = p.parse_args()
    plan(PART, CHECKS)
    reason = why_no_cuda()
    if reason is not None:
        for check in CHECKS:
            row(PART, check, "-", "-", "SKIPPED", reason)
        return 0
    from ferry.errors import FerryError
    from ferry.process import load_driver

    where = runtime()
    say(f"runtime: {where}")
    try:
        info = load_driver().info
    except FerryError as exc:
        unavailable(f"{where}: the driver's checkpoint API cannot be loaded: {exc}")
        return 0
    say(f"driver: CUDA {info.cuda_version_text}, cuda-bindings {info.bindings}, remap {info.can_remap}")
    nbytes = int(args.gb * 1e9) // 4096 * 4096
    holder = Holder(nbytes)
    try:
        run_checks(holder, nbytes, where)
    finally:
        holder.stop()
    return 0


def run_checks(holder: Holder, nbytes: int, where: str) -> None:
    from ferry.process import nvml

    pid = str(holder.proc.pid)
    states: list[str] = []
    code, doc, err, _ = ferry("process", "state", pid)
    states.append(f"running:{doc.get('state')}")
    held = sum(g["used_bytes"] for g in doc.get("gpus") or [])
    uuid = (doc.get("gpus") or [{}])[0].get("uuid")
    code, sus, err, wall = ferry("process", "suspend", pid, "--timeout", "20")
    if code != 0:
        note = f"{where}: the driver's answer: {err.splitlines()[-1] if err else code}"
        if where == "gVisor":
            unavailable(note)
        else:
            for check in CHECKS:
                row(PART, check, "-", "-", "FAIL", note)
        return
    seconds = float(sus["seconds"])
    row(
        PART,
        CHECKS[0],
        f"{seconds:.2f} s ({_steps(sus)}; command {wall:.2f} s) for {held / 1e9:.1f} GB held",
        "<= 10 s",
        verdict(sus["state"] == "checkpointed" and seconds <= 10),
    )
    _, doc, _, _ = ferry("process", "state", pid)
    states.append(f"checkpointed:{doc.get('state')}")
    released = doc.get("gpus") == [] and doc.get("suspend_record") is not None
    frozen = holder.drain(1.5)
    still = holder.drain(1.0) <= frozen + 1
    free_after_suspend = next((g.memory_free for g in nvml.gpus() if str(g.uuid) == uuid), 0)
    _preflight_rows(sus, holder, pid, uuid, held, states)
    code, wok, err, wall = ferry("process", "wake", pid)
    ok = code == 0 and wok.get("state") == "running"
    seconds = float(wok.get("seconds", 0.0))
    row(
        PART,
        CHECKS[1],
        f"{seconds:.2f} s ({_steps(wok)}; command {wall:.2f} s)",
        "<= 10 s",
        verdict(ok and seconds <= 10),
        "" if ok else err[-300:],
    )
    _, doc, _, _ = ferry("process", "state", pid)
    states.append(f"running:{doc.get('state')}")
    back = [g["uuid"] for g in doc.get("gpus") or []] == [uuid]
    row(
        PART,
        CHECKS[3],
        f"released {released} (NVML: no context while suspended, {free_after_suspend / 1e9:.1f} "
        f"GB free then), back on {uuid}: {back}",
        "released, then back",
        verdict(released and back),
    )
    before = holder.ticks
    moving = holder.drain(1.0) > before
    digest = holder.ask_digest()
    row(
        PART,
        CHECKS[4],
        f"frozen while suspended {still}; ticking after {moving}; digest same {digest == holder.digest}",
        "all true",
        verdict(still and moving and digest == holder.digest),
    )
    _locked_state(pid, states)
    good = all(s.split(":")[0] == s.split(":")[1] for s in states)
    row(PART, CHECKS[2], ", ".join(states), "each as expected", verdict(good))


def _steps(doc: dict[str, Any]) -> str:
    return ", ".join(f"{s['step']} {s['seconds']:.2f} s" for s in doc.get("steps", []))


def _locked_state(pid: str, states: list[str]) -> None:
    """Lock only (the library's step), ``ferry process state``, unlock."""
    from ferry.process import CudaProcess

    process = CudaProcess(int(pid))
    process.lock(timeout=20)
    try:
        _, doc, _, _ = ferry("process", "state", pid)
        states.append(f"locked:{doc.get('state')}")
    finally:
        process.unlock()
    _, doc, _, _ = ferry("process", "state", pid)
    states.append(f"running:{doc.get('state')}")


def _preflight_rows(
    sus: dict[str, Any], holder: Holder, pid: str, uuid: str | None, held: int, states: list[str]
) -> None:
    """While the process is suspended: its suspend's warnings; two wakes the preflight refuses."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    nccl = "libnccl" in maps
    warned = any("NCCL is loaded" in w for w in sus.get("warnings", []))
    row(
        PART,
        CHECKS[5],
        "; ".join(sus.get("warnings", [])) or "no warning",
        f"NCCL warned iff mapped ({nccl})",
        verdict(warned == nccl),
    )
    if uuid is None or held <= 0:  # without them the preflight has nothing to check against
        note = "NVML showed no GPU memory of the process before its suspend"
        row(PART, CHECKS[6], "-", "-", "SKIPPED", note)
        row(PART, CHECKS[7], "-", "-", "SKIPPED", note)
        return
    elsewhere = "GPU-00000000-0000-0000-0000-000000000000"
    code, _, err, _ = ferry("process", "wake", pid, "--map", f"{uuid}={elsewhere}")
    _, doc, _, _ = ferry("process", "state", pid)
    states.append(f"checkpointed:{doc.get('state')}")
    refused = code != 0 and "not on this machine" in err and doc.get("state") == "checkpointed"
    row(
        PART,
        CHECKS[6],
        f"exit {code}: {err.splitlines()[-1] if err else ''}"[:300],
        "refused, still checkpointed",
        verdict(refused),
    )
    code, err = _wake_without_room(pid, held)
    _, doc, _, _ = ferry("process", "state", pid)
    states.append(f"checkpointed:{doc.get('state')}")
    refused = code != 0 and "free memory there first" in err and doc.get("state") == "checkpointed"
    row(
        PART,
        CHECKS[7],
        f"exit {code}: {err.splitlines()[-1] if err else ''}"[:300],
        "refused, still checkpointed",
        verdict(refused),
    )


def _wake_without_room(pid: str, held: int) -> tuple[int, str]:
    """Take the GPU's free memory but a little less than the process held, then ``ferry process wake``."""
    import torch

    free, _ = torch.cuda.mem_get_info()
    take = max(0, free - held // 2)
    filler = torch.empty(take, dtype=torch.uint8, device="cuda")
    try:
        code, _, err, _ = ferry("process", "wake", pid)
    finally:
        del filler
        torch.cuda.empty_cache()
    return code, err


if __name__ == "__main__":
    raise SystemExit(main())
