"""What ``overlap_snapshot``'s probe of writes torch does not count (``ferry.engine.probe``)
costs, against the copy it lets training overlap.

For N host tensors of S MiB (the deferred parameters and optimizer state of a save), in
interleaved rounds: the probe's work at the safe point (note each tensor, read its probed
words: training blocked), its check once the copies are done (the third read and the
comparisons: on the training thread when the optimizer step comes first), and a plain copy
of the same bytes into a buffer (what the overlap takes off the safe point). The figure
printed last is (safe point + check) / copy, for the last shape: the part of the deferred
copy's time that the probe costs training at most.

    python benchmarks/probe.py [--shapes 64x4 1000x1] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from ferry.engine.probe import PROBE_WORDS, Probe


def one_round(srcs: list[torch.Tensor], dsts: list[torch.Tensor]) -> tuple[float, float, float]:
    """(safe point, check, copy) seconds. The tensors' byte views are made before the clock
    starts: the snapshot makes them for its copies anyway."""
    views = [(s.view(torch.uint8).numpy(), d.numpy()) for s, d in zip(srcs, dsts, strict=True)]
    t0 = time.perf_counter()
    probe = Probe()
    for s, (src, dst) in zip(srcs, views, strict=True):
        probe.host("t", s, src, dst)
    probe.first()
    t1 = time.perf_counter()
    for src, dst in views:
        np.copyto(dst, src)
    t2 = time.perf_counter()
    probe.again_host()
    if probe.changed() is not None:
        raise SystemExit("the probe saw a change where there was none")
    t3 = time.perf_counter()
    return t1 - t0, t3 - t2, t2 - t1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["64x4", "1000x1"], help="N tensors x S MiB")
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    torch.set_num_threads(1)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes]
    tensors = {s: [torch.randn(s[1] << 18) for _ in range(s[0])] for s in shapes}
    buffers = {s: [torch.empty(t.nbytes, dtype=torch.uint8) for t in tensors[s]] for s in shapes}
    times: dict[tuple[int, ...], list[tuple[float, float, float]]] = {s: [] for s in shapes}
    for r in range(args.rounds + 1):
        for s in shapes[r % len(shapes) :] + shapes[: r % len(shapes)]:
            out = one_round(tensors[s], buffers[s])
            if r:  # the first round touches the buffers' pages
                times[s].append(out)
    ratio = 0.0
    for s, runs in times.items():
        safe, check, copy = (statistics.median(x[i] for x in runs) for i in range(3))
        ratio = (safe + check) / copy
        print(f"{s[0]} tensors of {s[1]} MiB, {PROBE_WORDS} words each: safe point {safe * 1e3:.2f} ms "
              f"({safe / s[0] * 1e6:.1f} us a tensor), check {check * 1e3:.2f} ms, "
              f"copy of the same bytes {copy * 1e3:.1f} ms")  # fmt: skip
    print(f"probe (safe point + check) / copy of the deferred bytes: {ratio:.3f}")


if __name__ == "__main__":
    main()
