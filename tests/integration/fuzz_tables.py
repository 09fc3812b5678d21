"""Hostile values the checkpoint fuzzer (fuzz_checkpoints.py) writes into manifests, shared
with the table test of the manifest's fast path (test_manifest_fastpath.py)."""

from __future__ import annotations

from typing import Any

from ferry.engine.codec import TORCH_DTYPES

HOSTILE: list[Any] = [None, True, False, -1, 0, 1, 2**63 - 1, 2**64, -(2**63) - 1, 10**30, 1e308, -1.5,
                      "", "x", "../x", "/etc/passwd", "cuda:0", "float32", "<f8", "|O", [], [1, 2],
                      {}, {"a": 1}, [[[[]]]], {"__reduce__": "os.system"}]  # fmt: skip
DTYPES: list[Any] = [*TORCH_DTYPES, "<f8", "|b1", "<c16", ">i4", "|O", "<U4", "V8", "(2,)f8", "f8,i4",
                     "<M8[s]", "float128", "torch.float32", "S100000000000", 5, None, ["<f8"]]  # fmt: skip
FILES = ["../outside.bin", "/etc/passwd", "data-0.bin/", "", "x\x00", "rank-1.bin", "manifest.json",
         "./data-0.bin", "sub/../data-0.bin", "a" * 5000]  # fmt: skip
DEVICES: list[Any] = ["cpu", "cuda:0", "meta", "cuda:99999999", "xla:0", "", "cpu\nX", 7, "../../etc",
                      "cuda:-1", "nonsense", "cpu:0:1", "a" * 100]  # fmt: skip
NBYTES = "nbytes"
"""In SHAPES: a one-dimensional shape of the record's own byte count."""
SHAPES: list[Any] = [[2**31, 2**31], [2**62], [-1], [0] * 100, [1] * 40, [], [3, 0, 2**40], [2**63 - 1, 0],
                     NBYTES, [1.5], ["3"], 5, None]  # fmt: skip
