"""The checkpoint engine on a local folder: round trips, async saves, retention, refusals.

Everything goes through real files under ``tmp_path``. The only stand-ins are two small
storages registered under their own URL schemes through the backend registry (the public
extension point): one whose writes wait for a gate, so that "the save is still running"
is a fact rather than a race, and one whose writes fail, to follow an error to the caller.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ferry.engine import AsyncSaver, apply_retention, list_checkpoints, load, save, verify
from ferry.engine.codec import entries_json, flatten, layout, unflatten
from ferry.errors import (
    ConfigError,
    StorageError,
    UnsafeCheckpointError,
    UnsupportedStateError,
)
from ferry.storage import BACKENDS, open_storage
from ferry.storage.atomic import STAGING_PREFIX
from ferry.storage.local import LocalStorage, LocalWriter
from ferry.storage.sweep import swept

# ---------------------------------------------------------------------------- helpers


def make_model(seed: int) -> tuple[torch.nn.Sequential, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.BatchNorm1d(64),  # buffers, an int64 counter among them
        torch.nn.ReLU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(64, 4200),  # a weight above 1 MiB: written and read on its own
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 4200, generator=gen)
    torch.manual_seed(seed)  # dropout
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    return loss.detach()


def trained(seed: int, steps: int = 3) -> tuple[torch.nn.Sequential, torch.optim.Optimizer]:
    model, opt = make_model(seed)
    for i in range(steps):
        train_step(model, opt, 100 + i)
    return model, opt


def odd_tensors() -> dict[str, Any]:
    """Tensors that take the less travelled paths of the snapshot and the writer."""
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    return {
        "bf16": torch.linspace(-3, 3, 33).to(torch.bfloat16),
        "strided": base.t(),  # not contiguous
        "sliced": base[1:3, ::2],
        "scalar": torch.tensor(7, dtype=torch.int16),
        "empty": torch.empty(0, 5),
        "mask": torch.tensor([True, False, True]),
        "conj": torch.tensor([1 + 2j, -3j], dtype=torch.complex64).conj(),  # lazy conj bit
        "nan_bits": torch.tensor([float("nan"), -0.0, float("inf")]),
        "many_small": [torch.full((3,), float(i)) for i in range(300)],
    }


def plain_values() -> dict[str, Any]:
    return {
        "epoch": 3,
        "lr": 1e-3,
        "nan": float("nan"),
        "inf": float("-inf"),
        "name": "run-ü",
        "flag": True,
        "nothing": None,
        "blob": bytes(range(256)),
        "pair": (1, ("x", 2.5)),
        "by_int": {1: "one", -2: [None, {"deep": [1, 2, {"deeper": (3,)}]}]},
        "dunder": {"__reduce__": "just a key"},  # looks like a tag, is data
        "array": np.arange(10, dtype=np.float32).reshape(2, 5) / 3,
        "big_endian": np.arange(4, dtype=">i4"),
        "np_scalar": np.float64(2.5),
        "dtype": torch.float16,
        "device": torch.device("cpu"),
    }


def same(a: Any, b: Any, path: str = "state") -> None:
    """Bitwise equality through a tree (NaN equals NaN of the same bits, -0.0 != 0.0)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: {type(b).__name__}"
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{path}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        x, y = (t.detach().cpu().resolve_conj().contiguous().reshape(-1) for t in (a, b))
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), f"{path}: bytes differ"
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, path
        assert a.tobytes() == b.tobytes(), f"{path}: bytes differ"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{path}: keys {list(a)} vs {list(b)}"
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{path}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), path
    else:
        assert type(a) is type(b) and a == b, f"{path}: {a!r} vs {b!r}"


def steps(root: str) -> list[int]:
    return [r.step for r in list_checkpoints(open_storage(root))]


# ---------------------------------------------------------------------------- round trips


def test_round_trip_model_adamw_plain_values_bitwise(tmp_path: Path) -> None:
    model, opt = trained(seed=1)
    state = {"model": model, "opt": opt, "extra": plain_values(), "odd": odd_tensors()}
    expected = {"model": model.state_dict(), "opt": opt.state_dict(), "extra": plain_values()}
    root = str(tmp_path / "ckpt")
    info = save(state, root, step=3, meta={"note": "first"})
    assert info.step == 3 and info.url.endswith("step-000000000003") and info.nbytes > 1 << 20
    verify(open_storage(root), "step-000000000003")

    # decoded as plain values, without live objects
    loaded = load(root)
    assert loaded.step == 3 and loaded.manifest["meta"] == {"note": "first"}
    same(expected["model"], loaded.state["model"], "model")
    same(expected["opt"], loaded.state["opt"], "opt")
    same(expected["extra"], loaded.state["extra"], "extra")
    same(odd_tensors(), loaded.state["odd"], "odd")

    # restored into a fresh model and optimizer: the next steps are bitwise the same
    model2, opt2 = make_model(seed=2)
    target = {"model": model2, "opt": opt2, "extra": {}, "odd": {}}
    load(root, into=target)
    same(plain_values(), target["extra"], "extra")
    for i in range(3):
        same(train_step(model, opt, 200 + i), train_step(model2, opt2, 200 + i), f"loss {i}")
    same(model.state_dict(), model2.state_dict(), "model after training on")
    same(opt.state_dict(), opt2.state_dict(), "optimizer after training on")


def test_load_into_live_tensors_leaves_them_independent(tmp_path: Path) -> None:
    """Big tensors are read straight into the live ones; the loaded state must still be
    a faithful copy, and a later load must not alias earlier results."""
    model, opt = trained(seed=3)
    root = str(tmp_path / "ckpt")
    save({"model": model, "opt": opt}, root, step=1)
    model2, opt2 = make_model(seed=4)
    train_step(model2, opt2, 7)  # optimizer state exists: its moments are read into in place
    big = next(p for p in model2.parameters() if p.numel() > 1 << 18)
    before = (big.data_ptr(), opt2.state[big]["exp_avg"].data_ptr(), opt2.state[big]["exp_avg_sq"].data_ptr())
    load(root, into={"model": model2, "opt": opt2})
    same(model.state_dict(), model2.state_dict(), "model")
    same(opt.state_dict(), opt2.state_dict(), "opt")
    after = (big.data_ptr(), opt2.state[big]["exp_avg"].data_ptr(), opt2.state[big]["exp_avg_sq"].data_ptr())
    assert after == before, "the big tensors were not restored in place"
    plain = load(root).state
    big.data.add_(1)
    same(model.state_dict()["4.weight"], plain["model"]["4.weight"], "plain load is its own copy")


def test_async_round_trip_and_blocking_info(tmp_path: Path) -> None:
    model, opt = trained(seed=5)
    root = str(tmp_path / "ckpt")
    saver = AsyncSaver(root, keep_last=None)
    try:
        handle = saver.save({"model": model, "opt": opt, "extra": plain_values()}, step=11)
        info = handle.wait(timeout=60)
        assert handle.done() and handle.result() == info and handle.step == 11
        assert 0 < info.blocking_seconds <= info.seconds
    finally:
        saver.close()
    loaded = load(root)
    same(model.state_dict(), loaded.state["model"], "model")
    same(opt.state_dict(), loaded.state["opt"], "opt")
    same(plain_values(), loaded.state["extra"], "extra")


# ---------------------------------------------------------------------------- async semantics


class GatedWriter:
    """A real local file whose first write waits until the test opens the gate."""

    def __init__(self, path: str, gate: threading.Event, stats: dict[str, int]) -> None:
        self._inner = LocalWriter(path)
        self._gate, self._stats, self._first = gate, stats, True

    def write(self, data: memoryview | bytes) -> None:
        if self._first:
            self._first = False
            self._stats["active"] += 1
            self._stats["peak"] = max(self._stats["peak"], self._stats["active"])
            assert self._gate.wait(60), "gate never opened"
        self._inner.write(data)

    def close(self) -> None:
        self._inner.close()
        self._stats["active"] -= not self._first

    def abort(self) -> None:
        self._inner.abort()


class GatedStorage(LocalStorage):
    gate = threading.Event()
    stats = {"active": 0, "peak": 0}

    def __init__(self, url: str) -> None:
        super().__init__(url.removeprefix("gated://"))

    def open_writer(self, rel: str) -> Any:
        if not rel.endswith("data-0.bin"):
            return super().open_writer(rel)
        return GatedWriter(self._p(rel), self.gate, self.stats)


class FailingStorage(LocalStorage):
    """Writes fail while ``fail`` is set, the way a full disk fails them."""

    fail = True

    def __init__(self, url: str) -> None:
        super().__init__(url.removeprefix("failing://"))

    def open_writer(self, rel: str) -> Any:
        if self.fail and rel.endswith("data-0.bin"):
            raise StorageError(f"cannot write {self._p(rel)}: simulated failure")
        return super().open_writer(rel)


@pytest.fixture
def gated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setitem(BACKENDS, "gated", GatedStorage)
    GatedStorage.gate = threading.Event()
    GatedStorage.stats = {"active": 0, "peak": 0}
    yield f"gated://{tmp_path / 'ckpt'}"
    GatedStorage.gate.set()


def test_async_save_returns_after_snapshot_and_later_changes_stay_out(gated: str) -> None:
    model, opt = trained(seed=6)
    big = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB, written after the moment
    state: dict[str, Any] = {"model": model, "opt": opt, "big": big, "counter": [1, 2]}
    expected = {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "big": big.clone(),
    }
    saver = AsyncSaver(gated, keep_last=None)
    try:
        handle = saver.save(state, step=1)
        time.sleep(0.2)
        assert not handle.done(), "the save must still be persisting (its write is gated)"
        # training goes on while the checkpoint is written
        train_step(model, opt, 999)
        big.fill_(-1.0)
        state["counter"].append(3)
        GatedStorage.gate.set()
        handle.wait(timeout=60)
    finally:
        GatedStorage.gate.set()
        saver.close()
    loaded = load(gated.removeprefix("gated://"))
    same(expected["model"], loaded.state["model"], "model")
    same(expected["big"], loaded.state["big"], "big")
    assert loaded.state["counter"] == [1, 2]


def test_async_at_most_one_save_in_flight(gated: str) -> None:
    root = gated.removeprefix("gated://")
    t = torch.zeros(1 << 18)
    saver = AsyncSaver(gated, keep_last=None)
    second: dict[str, Any] = {}

    def save_again() -> None:
        t.fill_(2.0)
        second["handle"] = saver.save({"t": t}, step=2)

    try:
        first = saver.save({"t": t.fill_(1.0)}, step=1)
        thread = threading.Thread(target=save_again)
        thread.start()
        thread.join(0.5)
        assert thread.is_alive(), "a second save must wait while the first is in flight"
        assert not first.done() and steps(root) == []
        GatedStorage.gate.set()
        thread.join(60)
        second["handle"].wait(timeout=60)
        assert first.done()
    finally:
        GatedStorage.gate.set()
        saver.close()
    assert GatedStorage.stats["peak"] == 1, "two persists ran at once"
    assert steps(root) == [1, 2]
    storage = open_storage(root)
    names = [r.name for r in list_checkpoints(storage)]
    assert load(f"{root}/{names[0]}").state["t"].unique().tolist() == [1.0]  # buffer not reused early
    assert load(f"{root}/{names[1]}").state["t"].unique().tolist() == [2.0]


def test_async_error_surfaces_at_wait_and_at_next_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(BACKENDS, "failing", FailingStorage)
    monkeypatch.setattr(FailingStorage, "fail", True)
    root = tmp_path / "ckpt"
    saver = AsyncSaver(f"failing://{root}", keep_last=2)
    try:
        handle = saver.save({"x": torch.ones(4)}, step=1)
        with pytest.raises(StorageError, match="simulated failure"):
            handle.wait(timeout=60)
        with pytest.raises(StorageError, match="simulated failure"):
            saver.save({"x": torch.ones(4)}, step=2)
        # not waited for: the next save raises it
        saver.save({"x": torch.ones(4)}, step=3)
        with pytest.raises(StorageError, match="simulated failure"):
            saver.save({"x": torch.ones(4)}, step=4)
        assert steps(str(root)) == []
        assert os.listdir(root) == [], "a failed save left its staging folder behind"
        # once the storage works again, so do saves: the error was reported, not sticky
        monkeypatch.setattr(FailingStorage, "fail", False)
        saver.save({"x": torch.full((4,), 5.0)}, step=5).wait(timeout=60)
    finally:
        monkeypatch.setattr(FailingStorage, "fail", False)
        saver.close()
    assert steps(str(root)) == [5]


def test_async_error_goes_to_on_error_at_once_and_the_next_save_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With on_error (the session's), a background failure is reported from the saver's
    thread with its own step, and is not raised again: the next save is not skipped."""
    monkeypatch.setitem(BACKENDS, "failing", FailingStorage)
    monkeypatch.setattr(FailingStorage, "fail", True)
    root = tmp_path / "ckpt"
    errors: list[tuple[int, str, str]] = []
    saver = AsyncSaver(
        f"failing://{root}",
        keep_last=None,
        on_error=lambda step, exc: errors.append((step, str(exc), threading.current_thread().name)),
    )
    try:
        handle = saver.save({"x": torch.ones(4)}, step=7)
        with pytest.raises(StorageError):  # the handle itself still tells
            handle.wait(timeout=60)
        assert [(s, "simulated failure" in e, t.startswith("ferry-persist")) for s, e, t in errors] == [
            (7, True, True)
        ]
        monkeypatch.setattr(FailingStorage, "fail", False)
        saver.save({"x": torch.full((4,), 8.0)}, step=8).wait(timeout=60)  # made, not skipped
        monkeypatch.setattr(FailingStorage, "fail", True)
        with pytest.raises(StorageError):  # a blocking save's error goes to its caller only
            saver.save({"x": torch.ones(4)}, step=9, blocking=True)
        assert len(errors) == 1
        saver.save({"x": torch.ones(4)}, step=10)
    finally:
        saver.close()  # the failure of step 10 went to on_error: close does not raise it
    assert [s for s, _, _ in errors] == [7, 10]
    assert steps(str(root)) == [8]


def test_async_close_waits_and_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKENDS, "failing", FailingStorage)
    monkeypatch.setattr(FailingStorage, "fail", True)
    saver = AsyncSaver(f"failing://{tmp_path}", keep_last=None)
    saver.save({"x": torch.ones(2)}, step=1)
    with pytest.raises(StorageError):
        saver.close()


# ---------------------------------------------------------------------------- catalog


def test_retention_keep_last_and_keep_every(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    for step in range(1, 13):
        save({"step": step, "t": torch.full((3,), float(step))}, root, step=step, keep_last=2, keep_every=5)
    assert steps(root) == [5, 10, 11, 12]
    swept()
    assert sorted(os.listdir(root)) == [f"step-{s:012d}" for s in (5, 10, 11, 12)]
    for s in (5, 10, 11, 12):
        assert load(f"{root}/step-{s:012d}").state["step"] == s


def test_a_sync_save_returns_before_the_checkpoints_it_retires_are_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retired checkpoint is unlisted at once and deleted in the background; the next
    save waits for that before it writes; a process that exits right away still deletes."""
    root = tmp_path / "ckpt"
    save({"t": torch.zeros(4)}, str(root), step=1)
    gate, removing = threading.Event(), threading.Event()
    remove = LocalStorage.remove

    def slow_remove(self: LocalStorage, rel: str) -> None:
        if rel.startswith(STAGING_PREFIX):
            removing.set()
            assert gate.wait(30)
        remove(self, rel)

    monkeypatch.setattr(LocalStorage, "remove", slow_remove)
    save({"t": torch.ones(4)}, str(root), step=2, keep_last=1)  # returns, the deletion waits
    assert removing.wait(30) and steps(str(root)) == [2]
    assert len([n for n in os.listdir(root) if n.startswith(STAGING_PREFIX)]) == 1
    third = threading.Thread(target=save, args=({"t": torch.full((4,), 3.0)}, str(root)),
                             kwargs={"step": 3, "keep_last": 1})  # fmt: skip
    third.start()
    time.sleep(0.3)
    assert third.is_alive() and steps(str(root)) == [2], "the next save did not wait for the deletion"
    gate.set()
    third.join(30)
    swept()
    assert sorted(os.listdir(root)) == ["step-000000000003"]
    monkeypatch.undo()
    script = (
        "import sys, torch, ferry\n"
        "for step in (4, 5): ferry.save({'t': torch.zeros(1 << 20)}, sys.argv[1], step=step, keep_last=1)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(root)], check=True, timeout=120)
    assert sorted(os.listdir(root)) == ["step-000000000005"], "a deletion was lost at exit"


def test_retention_removes_leftovers_of_dead_saves(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    save({"a": 1}, str(root), step=1)
    (root / ".staging-step-000000000002-deadbeef").mkdir()
    (root / ".staging-step-000000000002-deadbeef" / "data-0.bin").write_bytes(b"half")
    (root / "step-000000000003").mkdir()  # no manifest: never committed
    (root / "unrelated.txt").write_text("not ferry's")
    assert steps(str(root)) == [1]
    removed = apply_retention(open_storage(str(root)), keep_last=5)
    assert sorted(removed) == [".staging-step-000000000002-deadbeef", "step-000000000003"]
    assert sorted(os.listdir(root)) == ["step-000000000001", "unrelated.txt"]


def test_listing_is_sorted_by_step_and_newest_wins(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    for step in (30, 10, 200, 20):
        save({"step": step}, root, step=step)
    assert steps(root) == [10, 20, 30, 200]
    assert load(root).state["step"] == 200


def test_same_step_twice_gets_a_suffix_and_is_newest(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    first = save({"v": torch.tensor([1.0])}, root, step=7)
    second = save({"v": torch.tensor([2.0])}, root, step=7)
    third = save({"v": torch.tensor([3.0])}, root, step=7)
    assert first.url.endswith("step-000000000007")
    assert second.url.endswith("step-000000000007.1")
    assert third.url.endswith("step-000000000007.2")
    refs = list_checkpoints(open_storage(root))
    assert [(r.step, r.seq) for r in refs] == [(7, 0), (7, 1), (7, 2)]
    assert load(root).state["v"].item() == 3.0
    apply_retention(open_storage(root), keep_last=1)
    assert [r.name for r in list_checkpoints(open_storage(root))] == ["step-000000000007.2"]


# ---------------------------------------------------------------------------- devices


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_load_target_device_cpu(tmp_path: Path, device: str | torch.device) -> None:
    model, opt = trained(seed=8)
    root = str(tmp_path / "ckpt")
    save({"model": model, "opt": opt}, root, step=1)
    loaded = load(root, target_device=device)
    for name, t in loaded.state["model"].items():
        assert t.device.type == "cpu", name
    same(model.state_dict(), loaded.state["model"])


def test_load_maps_tensors_to_another_device(tmp_path: Path) -> None:
    """The non-CPU path, on the one other device every machine has (``meta``)."""
    root = str(tmp_path / "ckpt")
    save({"w": torch.randn(5, 3), "n": np.arange(3)}, root, step=1)
    loaded = load(root, target_device="meta")
    assert loaded.state["w"].device.type == "meta" and loaded.state["w"].shape == (5, 3)
    assert isinstance(loaded.state["n"], np.ndarray)  # numpy arrays stay on the host


# ---------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("state", "path"),
    [
        ({"model": {"hooks": [1, lambda: 0]}}, "model.hooks.1"),
        ({"data": {"rows": np.array([{"a": 1}, None], dtype=object)}}, "data.rows"),
        ({"opts": (1, {"fn": print})}, "opts.1.fn"),
        ({"lock": threading.Lock()}, "lock"),
    ],
)
def test_unsupported_values_are_named_and_nothing_is_written(
    tmp_path: Path, state: dict[str, Any], path: str
) -> None:
    root = tmp_path / "ckpt"
    with pytest.raises(UnsupportedStateError) as err:
        save(state, str(root), step=1)
    assert path in str(err.value), str(err.value)
    assert not root.exists() or os.listdir(root) == []
    saver = AsyncSaver(str(root))
    try:
        with pytest.raises(UnsupportedStateError, match=path.replace(".", r"\.")):
            saver.save(state, step=1)
    finally:
        saver.close()


@pytest.mark.parametrize(
    "tree",
    [
        {"__reduce__": ["os.system", ["touch /tmp/pwned"]]},
        {"x": {"__class__": "subprocess.Popen"}},
        [1, {"__import__": "os"}],
        {"__global__": "builtins.eval"},
    ],
)
def test_tree_refuses_unknown_tags(tree: Any) -> None:
    with pytest.raises(UnsafeCheckpointError, match="unknown tag"):
        unflatten(tree, [])


@pytest.mark.parametrize(
    "tree",
    [
        {"__float__": "__import__('os')"},
        {"__tensor__": 3},
        {"__tensor__": "0"},
        {"__npscalar__": "|O", "value": 1},
        {"__dtype__": "object"},
        {"__dict__": [[[1, 2], "list as a key"]]},
    ],
)
def test_tree_refuses_malformed_values(tree: Any) -> None:
    with pytest.raises(UnsafeCheckpointError):
        unflatten(tree, [torch.zeros(1)])


def test_tree_round_trips_through_json_tags() -> None:
    values = plain_values()
    flat = flatten(values)
    same(values, unflatten(flat.tree, flat.arrays))


def test_the_tensor_table_is_json_dumps_character_for_character() -> None:
    """The table is formatted by hand, each kind's text once: it must be what json writes,
    for tensors of the same size and other shapes, scalars, empty ones, every kind."""
    state = {
        "a": torch.zeros(2, 3), "b": torch.zeros(6), "c": torch.zeros(3, 2), "d": torch.tensor(1.5),
        "e": torch.zeros(0, 4), "f": torch.zeros(2, 3, dtype=torch.float16), "g": np.zeros((2, 3)),
        "h": torch.zeros(2, 3), "i": [torch.zeros(1, 1, 1)] * 3, "j": np.arange(6, dtype=np.int8),
    }  # fmt: skip
    flat = flatten(state)
    layout(flat.entries, "data-7.bin")
    expected = json.dumps([e.to_json() for e in flat.entries], separators=(",", ":"))
    assert entries_json(flat.entries) == expected
    assert entries_json([]) == "[]"


@pytest.mark.parametrize("step", [-1, 10**12, True, 1.0])
def test_steps_outside_the_folder_name_are_refused(tmp_path: Path, step: Any) -> None:
    """A step that does not fit ``step-%012d`` would be saved and never listed."""
    root = tmp_path / "ckpt"
    with pytest.raises(ConfigError, match="step must be"):
        save({"a": 1}, str(root), step=step)
    saver = AsyncSaver(str(root))
    try:
        with pytest.raises(ConfigError, match="step must be"):
            saver.save({"a": 1}, step=step)
    finally:
        saver.close()
    assert not root.exists() or os.listdir(root) == []
    save({"a": 1}, str(root), step=10**12 - 1)
    assert steps(str(root)) == [10**12 - 1]


def test_async_meta_is_taken_at_the_call(gated: str) -> None:
    meta: dict[str, Any] = {"epoch": 1, "tags": ["a"]}
    saver = AsyncSaver(gated, keep_last=None)
    try:
        with pytest.raises(UnsupportedStateError, match="meta must be plain JSON"):
            saver.save({"x": 1}, step=1, meta={"fn": print})
        handle = saver.save({"x": 1}, step=2, meta=meta)
        meta["epoch"] = 2
        meta["tags"].append("b")
        GatedStorage.gate.set()
        handle.wait(timeout=60)
    finally:
        GatedStorage.gate.set()
        saver.close()
    assert load(gated.removeprefix("gated://")).manifest["meta"] == {"epoch": 1, "tags": ["a"]}


def test_a_mirror_writes_the_same_snapshot_while_the_checkpoint_is_written(
    gated: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The hand-over's copy (``handoff.leave`` as the save's mirror) is written from the one
    snapshot while the durable write is held at its gate; the save ends once both are
    written, and a mirror that fails costs the checkpoint nothing."""
    from ferry.runtime import handoff

    parent = tmp_path / "shm"
    parent.mkdir(mode=0o700)
    copy = str(parent / "job")
    model, opt = trained(seed=7)
    saver = AsyncSaver(gated, keep_last=None)
    try:
        handle = saver.save(
            {"model": model, "opt": opt}, step=4, mirror=functools.partial(handoff.leave, copy)
        )
        deadline = time.monotonic() + 60
        while not list_checkpoints(open_storage(copy)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [c.step for c in list_checkpoints(open_storage(copy))] == [4]
        assert not handle.done() and not list_checkpoints(open_storage(gated))  # still at its gate
        GatedStorage.gate.set()
        info = handle.wait(timeout=60)

        def broken(*_: Any) -> None:
            raise RuntimeError("tmpfs is gone")

        with caplog.at_level("WARNING", logger="ferry"):
            later = saver.save({"model": model}, step=5, mirror=broken, blocking=True).result()
    finally:
        GatedStorage.gate.set()
        saver.close()
    assert info.step == 4 and later.step == 5
    assert "the second copy of step 5 was not written: tmpfs is gone" in caplog.text
    mirrored, durable = load(copy), load(info.url)
    same(durable.state, mirrored.state)
    same(model.state_dict(), mirrored.state["model"], "model")
