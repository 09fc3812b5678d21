"""``overlap_snapshot``: a background save copies the parameters an optimizer updates, and
that optimizer's state, while the next forward and backward run; the optimizer's next step
waits for those copies; a script that changes them before that step fails the checkpoint
(never a checkpoint of two steps) and the overlap is off from then on. The copies are held
at a gate (``copy_gate``), standing for a copy slower than the step."""

from __future__ import annotations

import contextlib
import copy
import logging
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from copygate import CopyGate
from torch import nn

from ferry.engine import list_checkpoints, load
from ferry.engine import snapshot as snapshot_module
from ferry.engine.asyncsave import AsyncSaver, SaveHandle
from ferry.engine.deferred import OverlapBroken
from ferry.engine.probe import PROBE_WORDS, Probe
from ferry.session.overlap import Overlap, deferrable
from ferry.storage import open_storage


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    # Big enough that its tensors are not packed at the safe point (those are copied there: < 1 MiB).
    model = nn.Sequential(nn.Linear(512, 1024), nn.BatchNorm1d(1024), nn.Linear(1024, 256))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _train(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(32, 512)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict()})


def _restored(root: Path) -> dict[str, Any]:
    model, opt = _model()
    _train(model, opt)  # the optimizer's state exists, to be overwritten
    load(str(root), into={"model": model, "opt": opt})
    return _state(model, opt)


def _assert_equal(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_equal(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_equal(x, y)
    else:
        assert a == b


@dataclass
class Rig:
    """A trained model and its optimizer, saved by a background saver with the overlap on;
    ``failed``: the saves' failures as the saver reported them."""

    model: nn.Module
    opt: torch.optim.Optimizer
    saver: AsyncSaver
    overlap: Overlap
    failed: list[tuple[int, Exception]] = field(default_factory=list)

    @property
    def objects(self) -> dict[str, Any]:
        return {"model": self.model, "opt": self.opt}

    def save(self, step: int) -> SaveHandle:
        return self.saver.save(self.objects, step=step, defer=self.overlap.defer(self.objects, False))

    def train(self) -> None:
        _train(self.model, self.opt)


@contextlib.contextmanager
def _rig(root: Path, gate: CopyGate) -> Iterator[Rig]:
    model, opt = _model()
    _train(model, opt)
    failed: list[tuple[int, Exception]] = []
    saver = AsyncSaver(str(root), on_error=lambda step, exc: failed.append((step, exc)))
    rig = Rig(model, opt, saver, Overlap(saver.copied), failed)
    try:
        yield rig
    finally:
        gate.open()  # else closing waits for copies held forever
        saver.close()
        rig.overlap.close()


def test_the_next_step_waits_for_the_copies_and_the_checkpoint_holds_the_safe_point(
    tmp_path: Path, copy_gate: CopyGate
) -> None:
    with _rig(tmp_path, copy_gate) as rig:
        at_safe_point = _state(rig.model, rig.opt)
        handle = rig.save(1)
        assert copy_gate.pieces > 0, "nothing was deferred"
        stepped = threading.Event()

        def next_step() -> None:  # its forward changes the batch-norm statistics at once
            rig.train()
            stepped.set()

        thread = threading.Thread(target=next_step)
        thread.start()
        assert not stepped.wait(0.5), "the optimizer step did not wait for the copies"
        copy_gate.open()
        thread.join(30)
        assert stepped.is_set()
        info = handle.wait()
        waited = rig.saver.deferred.waited if rig.saver.deferred is not None else 0.0
        assert 0 < waited <= info.blocking_seconds  # the step's wait counts as training blocked
    _assert_equal(_restored(tmp_path), at_safe_point)
    assert not torch.equal(rig.model[0].weight, at_safe_point["model"]["0.weight"])  # it trained on


def test_a_parameter_changed_before_the_step_fails_that_checkpoint_and_ends_the_overlap(
    tmp_path: Path, copy_gate: CopyGate, caplog: pytest.LogCaptureFixture
) -> None:
    with _rig(tmp_path, copy_gate) as rig:
        copy_gate.open()
        rig.save(1).wait()
        committed = _state(rig.model, rig.opt)
        rig.train()
        copy_gate.close()
        handle = rig.save(2)
        with torch.no_grad():  # manual weight decay before the step: outside the contract
            rig.model[2].weight.mul_(0.5)
        copy_gate.open()
        with caplog.at_level(logging.WARNING, logger="ferry"):
            rig.train()
        with pytest.raises(OverlapBroken, match=r"model\.2\.weight changed in place"):
            handle.wait()
        assert [(step, type(exc)) for step, exc in rig.failed] == [(2, OverlapBroken)]
        assert "overlap_snapshot is off for the rest of this run" in caplog.text
        assert rig.overlap.defer(rig.objects, False) is None
    assert [c.step for c in list_checkpoints(open_storage(str(tmp_path)))] == [1]
    _assert_equal(_restored(tmp_path), committed)


def _refused(rig: Rig, handle: SaveHandle, committed: dict[str, Any], name: str, tmp_path: Path) -> None:
    """The save of step 2 failed, naming ``name``; step 1's stays the newest; the overlap is off."""
    with pytest.raises(OverlapBroken, match=rf"{name} was written without torch counting it"):
        handle.wait()
    assert [(step, type(exc)) for step, exc in rig.failed] == [(2, OverlapBroken)]
    assert rig.overlap.defer(rig.objects, False) is None
    assert [c.step for c in list_checkpoints(open_storage(str(tmp_path)))] == [1]
    _assert_equal(_restored(tmp_path), committed)


def test_a_write_through_data_before_the_copy_fails_that_checkpoint(
    tmp_path: Path, copy_gate: CopyGate, caplog: pytest.LogCaptureFixture
) -> None:
    """``p.data`` is a tensor with a version counter of its own: the parameter's never moves.
    The copy, held at the gate, would take the weight after the write, whole."""
    with _rig(tmp_path, copy_gate) as rig:
        copy_gate.open()
        rig.save(1).wait()
        committed = _state(rig.model, rig.opt)
        rig.train()
        copy_gate.close()
        handle = rig.save(2)
        weight = rig.model[2].weight
        version = weight._version
        weight.data.mul_(0.5)  # manual weight decay, the old way
        assert weight._version == version
        copy_gate.open()
        with caplog.at_level(logging.WARNING, logger="ferry"):
            rig.train()
        assert "overlap_snapshot is off for the rest of this run" in caplog.text
        _refused(rig, handle, committed, r"model\.2\.weight", tmp_path)


def test_a_write_through_a_numpy_view_during_the_copy_fails_that_checkpoint(
    tmp_path: Path, copy_gate: CopyGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first half of the weight's rows is copied, then the script halves the weight through
    a NumPy view, then the rest is copied: a torn tensor, which must not be committed."""
    monkeypatch.setattr(snapshot_module, "COPY_CHUNK", 64 << 10)  # 2 MiB: 32 pieces
    with _rig(tmp_path, copy_gate) as rig:
        copy_gate.open()
        rig.save(1).wait()
        committed = _state(rig.model, rig.opt)
        rig.train()
        copy_gate.close()
        handle = rig.save(2)
        copy_gate.allow(16)  # model.0.weight comes first: its rows 0-511
        rig.model[0].weight.detach().numpy()[:] *= 0.5
        copy_gate.open()
        rig.train()
        _refused(rig, handle, committed, r"model\.0\.weight", tmp_path)


@pytest.mark.parametrize(
    ("copy", "after", "changed"),
    [
        ("before", "before", False),  # nothing written: passes
        ("after", "after", True),  # written before the copy: the copy is not the safe point
        ("before", "after", True),  # written after the copy, before the check: refused too
        ("torn", "after", True),  # written during the copy
        ("after", "before", True),  # written, then put back (the copy holds the write)
    ],
)
def test_the_probe_sees_writes_its_version_counter_misses(copy: str, after: str, changed: bool) -> None:
    """The probed words of a tensor, at the safe point, in its copy and after it."""
    torch.manual_seed(0)
    src = torch.randn(1 << 16)
    before, written = src.clone(), src * 0.5
    dst = torch.zeros(src.nbytes, dtype=torch.uint8)
    probe = Probe()
    probe.host("w", src, src.view(torch.uint8).numpy(), dst.numpy())
    probe.first()
    half = src.numel() // 2
    copied = {"before": before, "after": written, "torn": torch.cat([before[:half], written[half:]])}[copy]
    dst.view(torch.float32).copy_(copied)
    src.detach().numpy()[:] = {"before": before, "after": written}[after].numpy()
    probe.again_host()
    assert probe.changed() == (("w", "behind torch's back") if changed else None)


def test_the_probe_draws_from_none_of_the_scripts_random_streams() -> None:
    """Its positions come from the operating system's entropy: a resumed run's random streams
    are the same whether or not a save probed anything."""
    src = torch.randn(1 << 16)
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.random.get_rng_state())
    probe = Probe()
    probe.host("w", src, src.view(torch.uint8).numpy(), np.zeros(src.nbytes, np.uint8))
    probe.first()
    assert random.getstate() == states[0]
    assert np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.random.get_rng_state(), states[2])
    assert PROBE_WORDS == 64  # the bound docs/api.md gives is for 64 words


def test_a_copy_that_fails_fails_its_save_and_not_the_training_step(
    tmp_path: Path, copy_gate: CopyGate
) -> None:
    with _rig(tmp_path, copy_gate) as rig:
        copy_gate.error = RuntimeError("CUDA error: an illegal memory access was encountered")
        copy_gate.open()
        handle = rig.save(1)
        rig.train()  # the optimizer step waits, and does not raise the copy's error
        with pytest.raises(RuntimeError, match="illegal memory access"):
            handle.wait()
        assert [str(exc) for _, exc in rig.failed] == ["CUDA error: an illegal memory access was encountered"]
        assert rig.overlap.on  # a failed copy breaks no contract of the script's
    assert list_checkpoints(open_storage(str(tmp_path))) == []


def test_only_what_an_optimizer_step_changes_is_deferred() -> None:
    model, _ = _model()
    model[2].requires_grad_(False)  # frozen: no optimizer updates it
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    ema = copy.deepcopy(model)  # changed by the script's own code after each step
    _train(model, opt)
    labels = deferrable({"model": model, "ema": ema, "opt": opt, "counters": {"epoch": 1}}).values()
    # The biases and the batch norm's parameters (4 KiB) are copied at the safe point.
    assert {str(label) for label in labels} == {"model.0.weight", "opt's momentum_buffer of model.0.weight"}


def test_an_optimizer_that_skips_the_step_hooks_defers_nothing() -> None:
    model, opt = _model()

    class Unhooked(torch.optim.SGD):
        pass

    raw = Unhooked(model.parameters(), lr=0.1)
    Unhooked.step = lambda self, closure=None: None  # type: ignore[method-assign,assignment]
    assert deferrable({"model": model, "opt": raw}) == {}
    assert [str(label) for label in deferrable({"model": model, "opt": opt}).values()] == [
        "model.0.weight",
        "model.2.weight",
    ]
    assert [str(label) for label in deferrable({"opt": opt}).values()] == [
        "parameter 0.0 of opt",
        "parameter 0.4 of opt",
    ]


def test_a_blocking_save_defers_nothing(tmp_path: Path) -> None:
    model, opt = _model()
    objects = {"model": model, "opt": opt}
    saver = AsyncSaver(str(tmp_path))
    overlap = Overlap(saver.copied)
    try:
        assert overlap.defer(objects, True) is None
        saver.save(objects, step=1, blocking=True, defer=overlap.defer(objects, False))
        assert saver.deferred is None
    finally:
        saver.close()
        overlap.close()
