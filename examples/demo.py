"""`make demo`: the main job end to end, on this machine, in about a minute.

1. Train examples/train.py plainly, start to finish: the reference.
2. Train it again under `ferry run` (zero code changes) and send the supervisor SIGTERM,
   as a scheduler would before preempting: the worker checkpoints at the next safe
   point and exits with 85 ("checkpointed, resume me").
3. Inspect and verify the checkpoint.
4. Migrate: copy the committed checkpoint to another "node" (a separate folder with its
   own job directory) and resume there with `ferry run`.
5. Proof: every per-step loss and every weight bit of the resumed run equals the
   reference.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "demo-out"
FERRY = str(Path(sys.executable).parent / "ferry")
TRAIN = [sys.executable, str(ROOT / "examples" / "train.py")]


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    print(
        "$ " + " ".join(os.path.relpath(c, ROOT) if c.startswith(str(ROOT)) else c for c in cmd), flush=True
    )
    return subprocess.run(cmd, text=True, **kwargs)  # type: ignore[call-overload, no-any-return]


def main() -> int:
    shutil.rmtree(OUT, ignore_errors=True)
    env = dict(os.environ, FERRY_HOME=str(OUT / "ferry-home"), PYTHONWARNINGS="ignore")

    say("1. reference run, plain python, never interrupted")
    run([*TRAIN, "--out", str(OUT / "reference")], env=env, check=True)

    say("2. the same script under `ferry run`, preempted by SIGTERM after 40 steps")
    node_a = OUT / "node-a"
    cmd = [FERRY, "run", "--job-id", "demo", "--dir", str(node_a / "checkpoints"), "--",
           *TRAIN, "--out", str(OUT / "run"), "--pause", "0.01"]  # fmt: skip
    print("$ ferry run --job-id demo --dir demo-out/node-a/checkpoints -- python examples/train.py ...")
    job = subprocess.Popen(cmd, env=env, text=True)
    losses = OUT / "run" / "losses.txt"
    while job.poll() is None and (not losses.exists() or losses.read_text().count("\n") < 40):
        time.sleep(0.02)
    job.send_signal(signal.SIGTERM)
    code = job.wait()
    print(f"ferry run exited with {code} (85: checkpointed, resume me)")
    if code != 85:
        return 1

    say("3. inspect and verify the checkpoint")
    run([FERRY, "inspect", str(node_a / "checkpoints")], env=env, check=True)
    run([FERRY, "verify", str(node_a / "checkpoints")], env=env, check=True)
    status = json.loads((OUT / "ferry-home" / "jobs" / "demo" / "status.json").read_text())
    print(f"job status: {status['state']} at step {status['step']}")

    say("4. migrate: move the checkpoint to node B and resume there")
    node_b = OUT / "node-b"
    shutil.copytree(node_a / "checkpoints", node_b / "checkpoints")
    shutil.rmtree(node_a)
    print("copied demo-out/node-a/checkpoints -> demo-out/node-b/checkpoints; node A wiped")
    env_b = dict(env, FERRY_HOME=str(node_b / "ferry-home"), CUDA_VISIBLE_DEVICES="")
    print("$ ferry run --job-id demo --dir demo-out/node-b/checkpoints -- python examples/train.py ...")
    done = subprocess.run([FERRY, "run", "--job-id", "demo", "--dir", str(node_b / "checkpoints"), "--",
                           *TRAIN, "--out", str(OUT / "run")], env=env_b, text=True)  # fmt: skip
    if done.returncode != 0:
        print(f"the resumed run failed with {done.returncode}")
        return 1

    say("5. proof")
    ref_losses = (OUT / "reference" / "losses.txt").read_text().splitlines()
    got_losses = (OUT / "run" / "losses.txt").read_text().splitlines()
    ref_w = (OUT / "reference" / "weights.txt").read_text()
    got_w = (OUT / "run" / "weights.txt").read_text()
    same_losses = ref_losses == got_losses
    same_weights = ref_w == got_w
    print(f"per-step losses: {len(got_losses)} steps, {'identical' if same_losses else 'DIFFERENT'}")
    print(
        f"weights: {len(ref_w.splitlines())} tensors, {'bitwise identical' if same_weights else 'DIFFERENT'}"
    )
    if same_losses and same_weights:
        print("\nThe job was preempted, moved to another node and resumed, and ended exactly where "
              "the uninterrupted run ended.")  # fmt: skip
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
