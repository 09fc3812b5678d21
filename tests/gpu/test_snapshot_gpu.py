"""The device-to-host snapshot: of state spread over several GPUs, every copy has landed when
``snapshot`` returns, whichever device is current (it synchronizes each device it copied
from, not only the current one); with ``overlap_snapshot``, the copies left running on a
side stream hold the safe point's values, and a write that torch does not count (through
``.data``) before they ran fails the checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from ferry.engine import list_checkpoints, load
from ferry.engine import snapshot as snapshot_module
from ferry.engine.asyncsave import AsyncSaver
from ferry.engine.codec import flatten
from ferry.engine.deferred import OverlapBroken
from ferry.engine.snapshot import HostBuffer, snapshot
from ferry.session.overlap import Overlap
from ferry.storage import open_storage


def test_a_snapshot_waits_for_every_gpu_it_copies_from() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: the copy from a GPU that is not the current one")
    torch.cuda.set_device(0)
    far = torch.randn(4096, 4096, device="cuda:1")
    for _ in range(4):  # work queued on cuda:1 that its copy to the host waits behind
        far = far @ far / 64
    flat = flatten({"near": torch.ones(16, device="cuda:0"), "far": far})
    host, _, _ = snapshot(flat, HostBuffer())
    entry = next(e for e in flat.entries if e.shape == [4096, 4096])
    got = host[entry.offset : entry.offset + entry.nbytes].clone()  # before anything else waits
    want = far.cpu().reshape(-1).view(torch.uint8)
    assert torch.equal(got, want)


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2048, 2048), nn.BatchNorm1d(2048), nn.Linear(2048, 2048)).cuda()
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def test_overlapped_copies_from_a_gpu_hold_the_safe_point_while_the_next_step_runs(tmp_path: Path) -> None:
    """``overlap_snapshot`` on a GPU: the parameters and the optimizer's state are copied on a
    side stream while the next step's forward and backward are queued on the current one;
    its optimizer step waits for them, and the checkpoint holds the safe point's values."""
    model, opt = _model()

    def step() -> None:
        x = torch.randn(256, 2048, device="cuda")
        for _ in range(8):  # enough queued work that the copies overlap it
            x = model(x).tanh()
        x.square().mean().backward()
        opt.step()
        opt.zero_grad()

    step()
    objects = {"model": model, "opt": opt}
    want = {k: v.cpu().clone() for k, v in model.state_dict().items()}
    saver = AsyncSaver(str(tmp_path))
    overlap = Overlap(saver.copied)
    try:
        defer = overlap.defer(objects, False)
        # the two 16 MiB weights and their two Adam moments each; biases and the norm's
        # parameters (under overlap's 1 MiB floor) are copied at the safe point
        assert defer is not None and len(defer) == 6, defer
        handle = saver.save(objects, step=1, defer=defer)
        assert saver.deferred is not None and saver.deferred.cuda_done
        step()
        handle.wait()
    finally:
        saver.close()
        overlap.close()
    got = load(str(tmp_path), target_device="cpu").state["model"]
    assert {k: torch.equal(got[k], v) for k, v in want.items()} == dict.fromkeys(want, True)


def test_a_data_write_before_the_side_streams_copy_fails_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The side stream is kept busy (a sleep queued on it before the copies), so the script's
    ``p.data.mul_()``, queued on the current stream, runs before the copies: they would take
    the weight after the write, which its version counter never sees."""
    side_stream = snapshot_module._side_stream

    def busy_side_stream(device: torch.device) -> torch.cuda.Stream:
        stream = side_stream(device)
        with torch.cuda.stream(stream):
            torch.cuda._sleep(500_000_000)  # ~0.3 s of GPU cycles ahead of the copies
        return stream

    monkeypatch.setattr(snapshot_module, "_side_stream", busy_side_stream)
    model, opt = _model()
    model(torch.randn(256, 2048, device="cuda")).square().mean().backward()
    opt.step()
    objects = {"model": model, "opt": opt}
    failed: list[Exception] = []
    saver = AsyncSaver(str(tmp_path), on_error=lambda step, exc: failed.append(exc))
    overlap = Overlap(saver.copied)
    try:
        handle = saver.save(objects, step=1, defer=overlap.defer(objects, False))
        weight = model[2].weight
        version = weight._version
        weight.data.mul_(0.5)  # on the current stream, ahead of the copies
        assert weight._version == version
        opt.step()  # waits for the copies: the overlap is off from here
        with pytest.raises(OverlapBroken, match=r"model\.2\.weight was written without torch counting it"):
            handle.wait()
    finally:
        saver.close()
        overlap.close()
    assert [type(exc) for exc in failed] == [OverlapBroken]
    assert not overlap.on
    assert list_checkpoints(open_storage(str(tmp_path))) == []
