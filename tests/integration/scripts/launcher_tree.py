"""A worker that spawns a child; both record every signal they get (to OUT/<role>.txt) until
SIGTERM, which ends them. OUT/<role>.ready appears once a process's handlers are in place."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

SIGNALS = [
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGUSR2,
    signal.SIGWINCH,
    signal.SIGCONT,
    signal.SIGALRM,
    signal.SIGRTMIN + 1,
    signal.SIGTERM,
]


def name(signum: int) -> str:
    return "SIGRTMIN+1" if signum == signal.SIGRTMIN + 1 else signal.Signals(signum).name


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--child", action="store_true")
    args = p.parse_args()
    role = "child" if args.child else "parent"
    got: list[int] = []
    for signum in SIGNALS:
        signal.signal(signum, lambda s, _f: got.append(s))
    child = None
    if not args.child:
        child = subprocess.Popen([sys.executable, __file__, "--out", args.out, "--child"])
    with open(os.path.join(args.out, f"{role}.ready"), "w") as f:
        f.write(str(os.getpid()))
    written = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = signal.SIGTERM in got  # read before writing: a later one is written next time
        if len(got) != written:
            written = len(got)
            tmp = os.path.join(args.out, f"{role}.tmp")
            with open(tmp, "w") as f:
                f.write("\n".join(sorted({name(s) for s in got})) + "\n")
            os.replace(tmp, os.path.join(args.out, f"{role}.txt"))
        if done:
            break
        time.sleep(0.02)
    if child is not None:
        sys.exit(child.wait())


if __name__ == "__main__":
    main()
