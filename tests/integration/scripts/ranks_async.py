"""A multi-rank job (torchrun, gloo on CPU) for the tests of asynchronous saves, with the
explicit API: each rank adds random draws (its own torch stream) to a tensor of its own
and logs, per step, ``step digest`` to ``rank<R>.log``, so that a test can compute what an
uninterrupted run logs. A stop records ``<exit status> <step>`` in ``exit<R>.txt``.

The checkpoint root (``FERRY_DIR``) can stall, as a slow disk does: with ``--hold PATH``,
while PATH exists, the ``--hold-nth``-th write of a file named ``--hold-name`` (a rank's
part) stops after its first bytes, mid-write, and says so by writing its pid to
``PATH.held``. ``--pause-at N`` holds training after step N until ``--release`` exists.
A test can so kill or signal ranks while a background save is in flight, without a race.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from gloo_exit import skip_finalization

import ferry
from ferry.storage import BACKENDS
from ferry.storage.local import LocalStorage, LocalWriter

SIZE = 4096


def digest(t: torch.Tensor) -> str:
    return hashlib.sha1(t.numpy().tobytes()).hexdigest()[:16]


def wait_while(path: str, exists: bool) -> None:
    give_up = time.monotonic() + 300
    while os.path.exists(path) is exists and time.monotonic() < give_up:
        time.sleep(0.01)


class HeldWriter:
    def __init__(self, inner: LocalWriter, hold: str) -> None:
        self.inner, self.hold, self.held = inner, hold, False

    def write(self, data: memoryview | bytes) -> None:
        self.inner.write(data)
        if not self.held:
            self.held = True
            with open(self.hold + ".held", "w") as f:
                f.write(str(os.getpid()))
            wait_while(self.hold, True)

    def close(self) -> None:
        self.inner.close()

    def abort(self) -> None:
        self.inner.abort()


class HeldStorage(LocalStorage):
    """A local root whose ``nth`` write of files named ``name`` stalls while ``hold`` exists."""

    def __init__(self, url: str, hold: str, name: str, nth: int) -> None:
        super().__init__(url.removeprefix("held://"))
        self.hold, self.name, self.nth = hold, name, nth

    def open_writer(self, rel: str) -> Any:
        writer = super().open_writer(rel)
        if os.path.basename(rel) != self.name:
            return writer
        self.nth -= 1
        if self.nth == 0 and os.path.exists(self.hold):
            return HeldWriter(writer, self.hold)
        return writer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--hold", default="")
    p.add_argument("--hold-name", default="")
    p.add_argument("--hold-nth", type=int, default=1)
    p.add_argument("--pause-at", type=int, default=-1)
    p.add_argument("--release", default="")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    BACKENDS["held"] = lambda url, **_: HeldStorage(url, args.hold, args.hold_name, args.hold_nth)
    ferry.configure(dir=f"held://{os.environ['FERRY_DIR']}")
    torch.manual_seed(100 + rank)
    state = {"w": torch.zeros(SIZE)}
    ferry.track(state=state)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.log"), "a") as log:
        try:
            while ferry.global_step < args.steps:
                state["w"].add_(torch.randn(SIZE))
                step = ferry.global_step + 1
                log.write(f"{step} {digest(state['w'])}\n")
                log.flush()
                if args.sleep:
                    time.sleep(args.sleep)
                if step == args.pause_at:
                    wait_while(args.release, False)
                ferry.step()
        except SystemExit as stop:
            with open(os.path.join(args.out, f"exit{rank}.txt"), "w") as f:
                f.write(f"{stop.code} {step}\n")
            raise
    ferry.close()  # the session lets go of the group before the group goes
    dist.barrier()  # no rank tears gloo down under another still talking to it
    skip_finalization()


if __name__ == "__main__":
    main()
