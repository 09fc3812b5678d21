"""The training loop's frames, in process: a capture in one run of a loop restored into
another run of the same loop through ``LoopKeeper`` (the session's own path, the
checkpoint's section parsed as a resume parses it), and what it keeps: counters,
positions of loops (closures over the arguments included), containers, NumPy arrays,
tensors, and objects of the script's own classes, nested."""

from __future__ import annotations

import sys
from collections import deque
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from ferry.autotrack import stack
from ferry.autotrack.keeper import LoopKeeper
from ferry.state import frameparse, framestate

pytestmark = pytest.mark.skipif(
    not stack.supported(), reason="frame stacks readable on CPython 3.11-3.13 only"
)


class Meter:
    def __init__(self) -> None:
        self.count = 0
        self.history: list[float] = []


class Shards:
    """A token loader of the nanoGPT kind: the current shard's tokens change with it."""

    def __init__(self) -> None:
        self.shard = 0
        self.position = 0
        self.tokens = np.arange(10, dtype=np.uint16)
        self.meter = Meter()
        self.weights = torch.zeros(3)
        self.seen = {"a"}


def _loop(n: int, stop_at: range, saved: SimpleNamespace, log: deque[Any], args: dict[str, int]) -> None:
    """A training loop in miniature; ``args`` is a cell too (the closure reads it). What the
    test keeps across runs is of library types (a range, a namespace, a deque), which the
    capture leaves alone: the caller's frames are frames of user code too."""

    def scale() -> int:
        return args["scale"]

    keeper = LoopKeeper()
    loader = Shards()
    total = 0
    results: list[dict[str, Any]] = []
    alias = results
    hidden = torch.zeros(2)
    for epoch in range(n):
        for i, x in enumerate([10, 20, 30]):
            if saved.frames is not None and not saved.done:  # the resumed run's restore point
                frameparse.parse(saved.frames, "test")  # as a resume parses it
                keeper.restore(saved.frames)
                saved.done = True
                assert alias is results  # names that held one list hold one list again
            if epoch * 3 + i in stop_at:
                saved.frames = keeper.capture({}, None)
                return
            total += x * scale()
            hidden = hidden + x
            loader.position += x
            if loader.position > 40:
                loader.shard, loader.position = loader.shard + 1, 0
                loader.tokens = np.arange(10, dtype=np.uint16) * (loader.shard + 1)
            loader.meter.count += 1
            loader.meter.history.append(total / 7)
            loader.weights += 1
            loader.seen.add(str(x))
            results.append({"epoch": epoch, "total": total})
            log.append((epoch, i, x, total, hidden.tolist(), loader.shard, loader.tokens.sum().item(),
                        loader.meter.count, sum(loader.meter.history), loader.weights.tolist(),
                        sorted(loader.seen), len(results)))  # fmt: skip


def test_a_loop_captured_in_one_run_continues_in_another(capsys: pytest.CaptureFixture[str]) -> None:
    plain: deque[Any] = deque()
    _loop(3, range(0), _saved(), plain, {"scale": 2})
    first: deque[Any] = deque()
    saved = _saved()
    _loop(3, range(5, 6), saved, first, {"scale": 2})
    second: deque[Any] = deque()
    _loop(3, range(0), saved, second, {"scale": 2})
    assert [*first, *second] == [*plain]
    assert capsys.readouterr().err == ""  # nothing refused, nothing it could not capture


def _saved() -> SimpleNamespace:
    return SimpleNamespace(frames=None, done=False)


def test_the_section_holds_what_each_name_held() -> None:
    saved = _saved()
    _loop(3, range(5, 6), saved, deque(), {"scale": 2})
    section = frameparse.parse(saved.frames, "test")
    assert isinstance(section, framestate.Section)
    frame = section.frames[-1]
    assert frame.qualname.endswith("_loop")
    kinds = {name: e.kind for name, e in frame.values.items()}
    assert kinds["loader"] == "object" and kinds["total"] == "value" and kinds["args"] == "value"
    assert "keeper" not in kinds and "scale" not in kinds  # a ferry object, a function
    loader = frame.values["loader"].attrs
    assert loader["tokens"].value.tolist() == (np.arange(10) * 2).tolist()
    assert loader["meter"].kind == "object" and loader["seen"].kind == "set"
    assert frame.values["results"].alias == frame.values["alias"].alias is not None
    assert [lp.state.kind for lp in frame.loops] == ["range", "enumerate"]


def test_a_loop_over_enumerate_in_a_function_with_a_closure_over_its_arguments(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """timm's train_one_epoch: the batch index is found and kept; no loop over "a dict"."""

    def train_one_epoch(loader: list[int], args: dict[str, Any]) -> dict[str, Any]:
        def lr(step: int) -> float:
            return float(args["lr"]) * step

        for batch_idx, _x in enumerate(loader):
            lr(batch_idx)
            if batch_idx == 2:
                return LoopKeeper().capture({}, None)
        raise AssertionError

    saved = train_one_epoch([5, 6, 7, 8], {"lr": 1})
    assert capsys.readouterr().err == ""
    frame = frameparse.parse(saved, "test").frames[-1]  # type: ignore[union-attr]
    (loop,) = frame.loops
    assert loop.state == framestate.LoopState(
        "enumerate", framestate.Enumerated(3, framestate.LoopState("list_iterator", 3))
    )


def test_frames_whose_code_changed_are_not_written(capsys: pytest.CaptureFixture[str]) -> None:
    saved = _saved()
    _loop(2, range(1, 2), saved, deque(), {"scale": 1})
    frame = saved.frames["frames"][-1]
    frame["code"] = "0" * 16
    frame["names"] = [*frame["names"], "lr"]
    log: deque[Any] = deque()
    _loop(2, range(0), saved, log, {"scale": 1})
    assert log[0][:2] == (0, 0)  # nothing written: the loop started over
    err = capsys.readouterr().err
    assert "the loop's counters and positions are not restored" in err
    assert "its variables changed since the checkpoint: `lr` no longer defined" in err


def test_a_section_from_an_earlier_ferry_is_not_restored(capsys: pytest.CaptureFixture[str]) -> None:
    old = {"by": "loader", "model": None, "frames": [{"file": "x.py", "qualname": "f", "line": 1}]}
    assert isinstance(frameparse.parse(old, "test"), framestate.Legacy)
    assert LoopKeeper().restore(old) == {}
    assert "written by an earlier ferry, which did not record the loop's code" in capsys.readouterr().err


def test_a_resumed_run_takes_its_baseline_before_restoring(capsys: pytest.CaptureFixture[str]) -> None:
    """A big array of an object that training changed is kept whole; one it did not change
    is kept by fingerprint, and a resumed run that holds other data is told so."""
    big = np.zeros(5 << 20, dtype=np.float32)  # 20 MiB, over the 16 MiB of a plain value
    holder = Shards()
    holder.tokens = big
    keeper = LoopKeeper()
    keeper.examine({}, None)  # the first safe point: tokens as the set-up made them
    saved = keeper.capture({}, None)
    entry = frameparse.parse(saved, "test").frames[-1].values["holder"].attrs["tokens"]  # type: ignore[union-attr]
    assert entry.kind == "fingerprint"
    holder.tokens = big + 1  # changed by training: kept whole at the next checkpoint
    saved = keeper.capture({}, None)
    entry = frameparse.parse(saved, "test").frames[-1].values["holder"].attrs["tokens"]  # type: ignore[union-attr]
    assert entry.kind == "value" and entry.value.sum() == big.size
    holder.tokens = big
    assert sys.getrefcount(big) > 1


def test_what_is_not_plain_is_left_alone_without_a_word(capsys: pytest.CaptureFixture[str]) -> None:
    """A list that holds itself, the model's parameters in a list, an optimizer's param
    groups: none is captured, none is watched (the last two are the tracked objects')."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cycle: list[Any] = [1]
    cycle.append(cycle)
    params = list(model.parameters())
    groups = opt.param_groups
    weight_view = model.weight.detach()
    keeper = LoopKeeper()
    objects = {"model": model, "opt": opt}
    keeper.examine(objects)
    cycle.append(2)
    groups[0]["lr"] = 0.2
    saved = keeper.capture(objects)
    frame = frameparse.parse(saved, "test").frames[-1]  # type: ignore[union-attr]
    assert not {"cycle", "params", "groups", "weight_view", "model", "opt"} & set(frame.values)
    err = capsys.readouterr().err
    assert "`cycle` (a local) changes during training" in err  # not captured, so said
    assert "groups" not in err and "params" not in err
    assert weight_view is not None and params
