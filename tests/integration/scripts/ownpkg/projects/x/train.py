"""A project's training script that drives a trainer of the user's own package (``mypkg``,
two folders up, imported from ``--lib``): the training loop's frames are in the package,
not under the script's folder. It never imports ferry."""

from __future__ import annotations

import argparse
import os
import sys


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--lib", required=True)
    p.add_argument("--max-iters", type=int, default=14)
    args = p.parse_args()
    sys.path.insert(0, args.lib)
    from mypkg.trainer import Trainer

    trainer = Trainer(args.max_iters)
    trainer.run()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "params.txt"), "w") as f:
        for name, t in trainer.model.state_dict().items():
            f.write(f"{name} {t.numpy().tobytes().hex()}\n")


if __name__ == "__main__":
    main()
