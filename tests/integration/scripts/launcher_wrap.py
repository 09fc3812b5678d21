"""Runs train_explicit.py (same argv) after two test hooks, each optional:

--record-env NAME=FILE  append os.environ[NAME] (or "-") to FILE: which env each start saw
--crash-once MARKER=N   on the first start only (MARKER does not exist yet), create MARKER
                        and SIGKILL this process at step N: a crash that a restart survives
--say TEXT              print TEXT first (a setup line: a warm worker's goes to its buffer)
--hold-warm FILE        in a warm worker (FERRY_WARM set), wait while FILE exists: it cannot
                        reach its restore point before the test lets it (before --record-env)
--linger FILE           at exit (after ferry's session closed: a stop is committed by then),
                        wait while FILE exists: the job is still alive, and stopping
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--record-env", default=None)
    p.add_argument("--crash-once", default=None)
    p.add_argument("--say", default=None)
    p.add_argument("--hold-warm", default=None)
    p.add_argument("--linger", default=None)
    hooks, rest = p.parse_known_args()
    if hooks.say:
        print(hooks.say, flush=True)
    if hooks.hold_warm and os.environ.get("FERRY_WARM"):
        import time

        give_up = time.monotonic() + 300  # a test that failed never lets it go
        while os.path.exists(hooks.hold_warm) and time.monotonic() < give_up:
            time.sleep(0.02)
    if hooks.linger:
        import atexit
        import time

        def linger(path: str = hooks.linger, give_up: float = time.monotonic() + 300) -> None:
            while os.path.exists(path) and time.monotonic() < give_up:
                time.sleep(0.02)

        atexit.register(linger)
    if hooks.record_env:
        name, _, path = hooks.record_env.partition("=")
        with open(path, "a") as f:
            f.write(os.environ.get(name, "-") + "\n")
    if hooks.crash_once:
        marker, _, step = hooks.crash_once.partition("=")
        if not os.path.exists(marker):
            open(marker, "w").close()
            rest += ["--kill-at", step]
    script = os.path.join(HERE, "train_explicit.py")
    sys.argv = [script, *rest]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
