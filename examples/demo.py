"""`make demo`: the main job end to end, on this machine, in about a minute.

1. Train examples/train.py plainly, start to finish: the reference.
2. Train it again under `ferry run` (zero code changes, no options) on "node A" and send
   the supervisor SIGTERM, as a scheduler would before preempting: the worker checkpoints
   at the next safe point and exits with 85 ("checkpointed, resume me").
3. Inspect and verify the checkpoint.
4. Move: copy the checkpoint root to "node B" (another folder, with its own job
   directory) and run the same command there with `--dir` naming the copy: it resumes.
5. Proof: every per-step loss and every weight bit of the resumed run equals the
   reference.
6. Run it once more on node B: the job finished, so there is nothing to do.
"""

from __future__ import annotations

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


def shown(cmd: list[str]) -> str:
    """A command as the reader would type it: paths relative to the repository."""
    words = ["ferry" if c == FERRY else "python" if c == sys.executable else c for c in cmd]
    return "$ " + " ".join(os.path.relpath(w, ROOT) if w.startswith(str(ROOT)) else w for w in words)


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    print(shown(cmd), flush=True)
    return subprocess.run(cmd, text=True, **kwargs)  # type: ignore[call-overload, no-any-return]


def main() -> int:
    shutil.rmtree(OUT, ignore_errors=True)
    node_a, node_b = OUT / "node-a", OUT / "node-b"
    node_a.mkdir(parents=True)
    env = dict(os.environ, FERRY_HOME=str(node_a / "ferry-home"), PYTHONWARNINGS="ignore")
    train = [*TRAIN, "--out", str(OUT / "run"), "--pause", "0.01"]

    say("1. reference run, plain python, never interrupted")
    run([*TRAIN, "--out", str(OUT / "reference")], env=env, check=True)

    say("2. the same script under `ferry run` on node A, preempted by SIGTERM after 40 steps")
    print(f"(in {os.path.relpath(node_a, ROOT)})")
    cmd = [FERRY, "run", "--", *train]
    print(shown(cmd), flush=True)
    job = subprocess.Popen(cmd, env=env, text=True, cwd=node_a)
    losses = OUT / "run" / "losses.txt"
    while job.poll() is None and (not losses.exists() or losses.read_text().count("\n") < 40):
        time.sleep(0.02)
    job.send_signal(signal.SIGTERM)
    code = job.wait()
    print(f"ferry run exited with {code} (85: checkpointed, resume me)")
    if code != 85:
        return 1

    say("3. inspect and verify the checkpoint")
    (root,) = (node_a / "ferry-checkpoints").iterdir()  # the job's: ./ferry-checkpoints/JOB
    run([FERRY, "inspect", str(root)], env=env, check=True)
    run([FERRY, "verify", str(root)], env=env, check=True)

    say("4. move: copy the checkpoints to node B and run the same command there")
    copy = node_b / "checkpoints"
    shutil.copytree(root, copy)
    print(f"copied {os.path.relpath(root, ROOT)} -> {os.path.relpath(copy, ROOT)}")
    env_b = dict(env, FERRY_HOME=str(node_b / "ferry-home"), CUDA_VISIBLE_DEVICES="")
    done = run([FERRY, "run", "--dir", str(copy), "--", *train], env=env_b, cwd=node_b)
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
    if not (same_losses and same_weights):
        return 1

    say("6. the same command once more on node B: the job finished, nothing to train")
    again = run([FERRY, "run", "--dir", str(copy), "--", *train], env=env_b, cwd=node_b)
    if again.returncode != 0 or (OUT / "run" / "losses.txt").read_text().splitlines() != got_losses:
        print("the finished job ran again")
        return 1
    print("\nThe job was preempted, moved to another node and resumed, and ended exactly where "
          "the uninterrupted run ended.")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
