"""One suite that every storage backend passes: local folder, memory://, S3 (moto), XRootD.

Each test gets a fresh checkpoint root on one backend (``backend_root`` in conftest.py) and
goes through the public engine and CLI only, the way a training script and an operator do.
"""

from __future__ import annotations

import json
import logging
import math
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner, Result

from ferry.cli import main
from ferry.engine import apply_retention, list_checkpoints, load, save, verify
from ferry.engine.codec import flatten
from ferry.engine.persist import persist
from ferry.engine.snapshot import HostBuffer, byte_view, snapshot
from ferry.errors import CorruptCheckpointError, FerryError
from ferry.storage import Storage, open_storage
from ferry.storage.atomic import MANIFEST, MARKER
from ferry.storage.sweep import swept

pytestmark = pytest.mark.integration


# ---------------------------------------------------------------------------- helpers


def make_model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(5, 8, generator=gen), torch.randn(5, 3, generator=gen)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
    opt.step()


def plain_values() -> dict[str, Any]:
    return {
        "epoch": 3,
        "by_int": {1: "one", 2: (2.5, None), -7: [True, False]},
        "tuple": (1, "x", (2, 3)),
        "nan": float("nan"),
        "neg_inf": float("-inf"),
        "blob": bytes(range(256)),
        "array": np.arange(12, dtype=np.float32).reshape(3, 4) / 3,
        "nested": {"list": [1, {"ints": np.array([[1, -2]], dtype=np.int64)}], "empty": {}},
    }


def assert_bitwise(a: Any, b: Any, path: str = "state") -> None:
    """Equal bit for bit, and of the same types (a tuple stays a tuple, nan stays nan)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{path}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        bits_a, bits_b = (t.detach().reshape(-1).contiguous().view(torch.uint8) for t in (a, b))
        assert torch.equal(bits_a, bits_b), f"{path}: tensor bytes differ"
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{path}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        assert a.tobytes() == b.tobytes(), f"{path}: array bytes differ"
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        # key order is not compared: the manifest is JSON with sorted keys
        assert set(a) == set(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_bitwise(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_bitwise(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def small_state(value: float) -> dict[str, Any]:
    return {"w": torch.full((4,), value), "step_value": value}


def steps(root: str) -> list[int]:
    return [r.step for r in list_checkpoints(open_storage(root))]


def cli(*args: str, expect: int = 0) -> Result:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == expect, (
        f"ferry {' '.join(args)} exited {result.exit_code}, expected {expect}\n"
        f"{result.output}\n{result.exception!r}"
    )
    return result


class Died(Exception):
    """The process 'dies' at the commit: everything before it was written."""


class DiesAtCommit:
    """A backend that works until the commit step of a save, which never happens.

    The commit is the last call of a save (see ferry.storage.base): ``rename`` for the
    rename strategy, writing the ``COMMITTED`` marker for the marker strategy.
    """

    def __init__(self, inner: Storage) -> None:
        self._inner = inner
        self.url = inner.url
        self.atomic_rename = inner.atomic_rename

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return getattr(self._inner, name)  # type: ignore[no-any-return]

    def rename(self, src: str, dst: str) -> None:
        raise Died(f"rename {src} -> {dst}")

    def write_bytes(self, rel: str, data: bytes) -> None:
        if rel.rsplit("/", 1)[-1] == MARKER:
            raise Died(f"write {rel}")
        self._inner.write_bytes(rel, data)

    def remove(self, rel: str) -> None:
        """A dead process cleans nothing up: the save's abort removes nothing."""


def save_without_commit(root: str, state: Any, step: int) -> None:
    flat = flatten(state)
    host, _, _ = snapshot(flat, HostBuffer())
    with pytest.raises(Died):
        persist(DiesAtCommit(open_storage(root)), flat, byte_view(host), step)


# ------------------------------------------------------------------------------ tests


def test_round_trip_is_bitwise(backend_root: str) -> None:
    model, opt = make_model(seed=0)
    train_step(model, opt, seed=1)  # AdamW now has exp_avg, exp_avg_sq and step
    plain = plain_values()
    info = save({"model": model, "opt": opt, "plain": plain}, backend_root, step=7)
    assert info.step == 7 and info.url.startswith(backend_root.rstrip("/"))

    model2, opt2 = make_model(seed=99)  # different weights, no optimizer state yet
    target: dict[str, Any] = {"model": model2, "opt": opt2, "plain": {}}
    loaded = load(backend_root, into=target)

    assert loaded.step == 7 and loaded.url == info.url
    assert_bitwise(model.state_dict(), model2.state_dict(), "model")
    assert_bitwise(opt.state_dict(), opt2.state_dict(), "opt")
    assert_bitwise(plain, loaded.state["plain"], "plain")
    assert_bitwise(plain, target["plain"], "plain (in place)")
    assert math.isnan(target["plain"]["nan"])
    # and the resumed run goes on exactly as the original one
    train_step(model, opt, seed=2)
    train_step(model2, opt2, seed=2)
    assert_bitwise(model.state_dict(), model2.state_dict(), "model after one more step")


def test_listing_is_sorted_by_step_and_retention_keeps_what_it_should(backend_root: str) -> None:
    assert steps(backend_root) == []
    for step in (30, 10, 20, 20, 40):
        save(small_state(step), backend_root, step=step)
    refs = list_checkpoints(open_storage(backend_root))
    assert [(r.step, r.seq) for r in refs] == [(10, 0), (20, 0), (20, 1), (30, 0), (40, 0)]
    assert load(backend_root).step == 40

    # keep the newest 2, and every multiple of 20 besides
    save(small_state(50), backend_root, step=50, keep_last=2, keep_every=20)
    assert steps(backend_root) == [20, 20, 40, 50]
    storage = open_storage(backend_root)
    swept()  # the retired checkpoints' bytes are deleted in the background
    assert storage.listdir() == [r.name for r in list_checkpoints(storage)], "deleted folders left behind"

    removed = apply_retention(storage, keep_last=1)
    assert len(removed) == 3
    assert steps(backend_root) == [50]
    assert_bitwise(small_state(50), load(backend_root).state)


def test_uncommitted_save_is_never_listed_nor_loaded(backend_root: str) -> None:
    save(small_state(1.0), backend_root, step=1)
    save_without_commit(backend_root, small_state(2.0), step=2)

    storage = open_storage(backend_root)
    committed = [r.name for r in list_checkpoints(storage)]
    leftovers = [n for n in storage.listdir() if n not in committed]
    assert len(committed) == 1 and len(leftovers) == 1
    assert storage.exists(f"{leftovers[0]}/{MANIFEST}"), "the dying save should have written everything"

    assert steps(backend_root) == [1]
    assert load(backend_root).step == 1
    assert json.loads(cli("inspect", backend_root, "--json").stdout)["step"] == 1

    # a later save is not confused by the leftover, and retention sweeps it
    save(small_state(3.0), backend_root, step=3, keep_last=5)
    assert steps(backend_root) == [1, 3]
    assert leftovers[0] not in open_storage(backend_root).listdir()


def test_uncommitted_folder_is_refused_by_url(backend_root: str) -> None:
    save(small_state(1.0), backend_root, step=1)
    save_without_commit(backend_root, small_state(2.0), step=2)
    storage = open_storage(backend_root)
    committed = {r.name for r in list_checkpoints(storage)}
    leftover = next(n for n in storage.listdir() if n not in committed)
    with pytest.raises(FerryError):
        load(storage.child_url(leftover))


def test_damaged_file_is_detected_and_load_falls_back(
    backend_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    save(small_state(1.0), backend_root, step=1)
    save(small_state(2.0), backend_root, step=2)
    storage = open_storage(backend_root)
    good, bad = (r.name for r in list_checkpoints(storage))

    # flip one byte in the middle of the newest checkpoint's data, through the backend
    data = bytearray(storage.read_bytes(f"{bad}/data-0.bin"))
    data[len(data) // 2] ^= 0x01
    storage.write_bytes(f"{bad}/data-0.bin", bytes(data))

    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        verify(storage, bad)
    assert verify(storage, good)["step"] == 1
    with pytest.raises(CorruptCheckpointError):
        load(backend_root, fallback=False)
    with caplog.at_level(logging.WARNING, logger="ferry"):
        loaded = load(backend_root)
    assert loaded.step == 1
    assert_bitwise(small_state(1.0), loaded.state)
    assert any("damaged" in r.getMessage() for r in caplog.records)

    out = cli("verify", backend_root, expect=CorruptCheckpointError.exit_code).output
    assert "BAD" in out and "checksum" in out
    report = json.loads(cli("verify", backend_root, "--all", "--json", expect=5).stdout)
    assert [(r["step"], r["ok"]) for r in report] == [(1, True), (None, False)]
    cli("verify", storage.child_url(good))


def test_cli_inspect_and_verify(backend_root: str) -> None:
    model, opt = make_model(seed=0)
    train_step(model, opt, seed=1)
    save({"model": model, "opt": opt}, backend_root, step=5, meta={"run": "r1"})
    info = save({"model": model, "opt": opt}, backend_root, step=6, meta={"run": "r1"})

    doc = json.loads(cli("inspect", backend_root, "--json").stdout)
    assert (doc["step"], doc["url"], doc["meta"]) == (6, info.url, {"run": "r1"})
    assert doc["bytes"] > 0 and doc["tensors"] == 4 + 2 * 4 + 4  # params, exp_avg(_sq), steps

    docs = json.loads(cli("inspect", backend_root, "--all", "--json").stdout)
    assert [d["step"] for d in docs] == [5, 6]

    one = json.loads(cli("inspect", info.url, "--tensors", "--json").stdout)
    assert one["step"] == 6
    assert {t["name"] for t in one["tensor_list"]} >= {"model.0.weight", "model.2.bias"}

    assert cli("verify", backend_root).output.startswith("ok ")
    expected = {"url": info.url, "step": 6, "ok": True, "error": None}
    assert json.loads(cli("verify", info.url, "--json").stdout) == expected
    assert all(r["ok"] for r in json.loads(cli("verify", backend_root, "--all", "--json").stdout))
