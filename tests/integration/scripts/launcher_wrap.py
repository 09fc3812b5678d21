"""Runs train_explicit.py (same argv) after two test hooks, each optional:

--record-env NAME=FILE  append os.environ[NAME] (or "-") to FILE: which env each start saw
--crash-once MARKER=N   on the first start only (MARKER does not exist yet), create MARKER
                        and SIGKILL this process at step N: a crash that a restart survives
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
    hooks, rest = p.parse_known_args()
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
