"""Issue 19: every tensor a load creates owns memory of exactly its own size.

A loaded tensor that is a view of a buffer shared with its neighbours keeps that buffer
alive and carries it everywhere its storage goes: ``torch.save`` of one 400-byte tensor
wrote the whole 300 KB buffer. Through the public API, on real files.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ferry.engine import load, save
from ferry.format.wire import manifest_bytes


def small_tensors(count: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"t{i}": torch.randn(100 + (i * 37) % 301, generator=g) for i in range(count)}


def saved_size(value: Any) -> int:
    buf = io.BytesIO()
    torch.save(value, buf)
    return len(buf.getvalue())


def tensors_of(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in tensors_of(v)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in tensors_of(v)]
    return []


def assert_owned(tensors: list[torch.Tensor]) -> None:
    for t in tensors:
        assert t.is_contiguous()
        assert t.untyped_storage().nbytes() == t.nbytes, (
            f"a {tuple(t.shape)} {t.dtype} tensor holds {t.untyped_storage().nbytes()} bytes of storage"
        )
    ptrs = [t.untyped_storage().data_ptr() for t in tensors if t.nbytes]
    assert len(set(ptrs)) == len(ptrs), "two loaded tensors share a storage"


def test_300_small_tensors_each_own_their_storage(tmp_path: Path) -> None:
    state = small_tensors(300)
    save(state, str(tmp_path / "ck"), step=1)
    loaded = load(str(tmp_path / "ck")).state
    assert loaded.keys() == state.keys()
    for key, t in state.items():
        assert torch.equal(loaded[key], t)
    assert_owned(list(loaded.values()))
    one = loaded["t8"]  # 396 elements
    assert saved_size(one) == saved_size(state["t8"].clone())
    assert saved_size(one) < 4 * one.nbytes


def test_big_small_empty_and_numpy_arrays_mixed_beyond_one_read_buffer(tmp_path: Path) -> None:
    """More small bytes than a bounce buffer holds (placement.BOUNCE_BYTES), among big tensors,
    empty ones and numpy arrays: all values intact, every tensor on its own storage."""
    g = torch.Generator().manual_seed(1)
    state: dict[str, Any] = {}
    for i in range(4500):
        state[f"s{i}"] = torch.randn(1024, generator=g)  # 4 KiB each: 18 MiB in all
        if i % 1500 == 0:
            state[f"big{i}"] = torch.randn(300_000, generator=g)
            state[f"empty{i}"] = torch.empty(0, 3)
            state[f"int{i}"] = torch.arange(7, dtype=torch.int16)
            state[f"bool{i}"] = torch.arange(5) % 2 == 0
            state[f"cplx{i}"] = torch.randn(3, 5, 2, dtype=torch.complex128, generator=g)
            state[f"half{i}"] = torch.randn(2, 9, generator=g).to(torch.bfloat16)
            state[f"scalar{i}"] = torch.tensor(3.5, dtype=torch.float64)
            state[f"np{i}"] = np.arange(50, dtype=np.float64)
    save(state, str(tmp_path / "ck"), step=1)
    loaded = load(str(tmp_path / "ck")).state
    for key, value in state.items():
        if isinstance(value, np.ndarray):
            assert np.array_equal(loaded[key], value)
        else:
            assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key
    assert_owned(tensors_of(loaded))


def test_optimizer_restored_from_a_load_owns_its_state(tmp_path: Path) -> None:
    """``Optimizer.load_state_dict`` keeps the tensors it is given: those must own their memory,
    so ``torch.save`` of the optimizer writes what the uninterrupted run would."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(12, 12) for _ in range(20)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 12)).sum().backward()  # type: ignore[no-untyped-call]
    opt.step()
    save({"model": model, "opt": opt}, str(tmp_path / "ck"), step=1)

    torch.manual_seed(1)
    model2 = torch.nn.Sequential(*(torch.nn.Linear(12, 12) for _ in range(20)))
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
    load(str(tmp_path / "ck"), into={"model": model2, "opt": opt2})
    assert_owned(tensors_of(opt2.state_dict()["state"]))
    assert saved_size(opt2.state_dict()) == saved_size(opt.state_dict())
    assert saved_size(model2.state_dict()) == saved_size(model.state_dict())


def test_tensors_that_share_bytes_in_the_file_keep_sharing(tmp_path: Path) -> None:
    """A file whose tensors are views of one base (ferry never writes one; another writer
    may): the views come back sharing one buffer, as they did; the others own theirs."""
    base = torch.arange(1000, dtype=torch.float32)
    save({"base": base, "a": torch.zeros(100), "b": torch.zeros(300), "alone": torch.ones(50)},
         str(tmp_path / "ck"), step=1)  # fmt: skip
    folder = next((tmp_path / "ck").iterdir())
    doc = json.loads((folder / "manifest.json").read_text())
    doc.pop("checksum")
    entries = doc["tensors"]
    at = entries[doc["tree"]["base"]["__tensor__"]]["offset"]
    entries[doc["tree"]["a"]["__tensor__"]]["offset"] = at + 100 * 4  # base[100:200]
    entries[doc["tree"]["b"]["__tensor__"]]["offset"] = at + 800 * 4  # base[800:1000] + 100 beyond
    (folder / "manifest.json").write_bytes(manifest_bytes(doc))

    loaded = load(str(folder)).state
    a, b, whole = loaded["a"], loaded["b"], loaded["base"]
    assert torch.equal(a, base[100:200]) and torch.equal(b[:200], base[800:])
    storage = whole.untyped_storage()
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() == storage.data_ptr()
    assert storage.nbytes() == 1100 * 4  # base and b's span beyond it, nothing more
    whole[150] = -1.0
    assert a[50] == -1.0, "the views no longer share their base"
    assert_owned([loaded["alone"]])
    assert torch.equal(loaded["alone"], torch.ones(50))
