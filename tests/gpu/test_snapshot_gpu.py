"""The device-to-host snapshot of state spread over several GPUs: every copy has landed when
``snapshot`` returns, whichever device is current (it synchronizes each device it copied
from, not only the current one)."""

from __future__ import annotations

import pytest
import torch

from ferry.engine.format import flatten
from ferry.engine.snapshot import HostBuffer, snapshot


def test_a_snapshot_waits_for_every_gpu_it_copies_from() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: the copy from a GPU that is not the current one")
    torch.cuda.set_device(0)
    far = torch.randn(4096, 4096, device="cuda:1")
    for _ in range(4):  # work queued on cuda:1 that its copy to the host waits behind
        far = far @ far / 64
    flat = flatten({"near": torch.ones(16, device="cuda:0"), "far": far})
    host, _ = snapshot(flat, HostBuffer())
    entry = next(e for e in flat.entries if e.shape == [4096, 4096])
    got = host[entry.offset : entry.offset + entry.nbytes].clone()  # before anything else waits
    want = far.cpu().reshape(-1).view(torch.uint8)
    assert torch.equal(got, want)
