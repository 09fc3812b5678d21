"""Issue 17, many tensors: what the fast paths of a save and a load must keep.

Small tensors are packed by address into shared buffers when saved, the manifest is written
in its canonical form and verified from its bytes, and the collector is paused meanwhile.
Through the public API, on real files; the speed itself is benchmarks/engine.py's business.
"""

from __future__ import annotations

import gc
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xxhash

from ferry.engine import AsyncSaver, list_checkpoints, load, read_manifest, save, verify
from ferry.engine.runs import LONGEST as RUN_LONGEST
from ferry.engine.snapshot import PACK_BYTES, PACK_MAX
from ferry.errors import CorruptCheckpointError, UnsafeCheckpointError
from ferry.format.wire import manifest_checksum, written_checksum
from ferry.storage import open_storage


def mixed_state(seed: int) -> dict[str, Any]:
    """Small tensors past several pack buffers, with every kind of array between them that
    takes another path: big ones, empty ones, non-contiguous, lazily conjugated, bfloat16,
    parameters (that require grad, and frozen ones), numpy arrays, 0-d tensors."""
    g = torch.Generator().manual_seed(seed)
    state: dict[str, Any] = {}
    small_bytes = 0
    i = 0
    while small_bytes < 2 * PACK_BYTES + PACK_MAX:
        n = 1 + (i * 7919) % 3000  # most sizes leave padding after them
        state[f"s{i}"] = torch.randn(n, generator=g)
        small_bytes += 4 * n
        if i % 400 == 0:
            state[f"big{i}"] = torch.randn(PACK_MAX // 4 + 3, generator=g)  # just past PACK_MAX
            state[f"empty{i}"] = torch.empty(0, 4)
            state[f"strided{i}"] = torch.randn(30, 20, generator=g).t()
            state[f"conj{i}"] = torch.randn(5, dtype=torch.complex64, generator=g).conj()
            state[f"bf16{i}"] = torch.randn(3, 7, generator=g).to(torch.bfloat16)
            state[f"param{i}"] = torch.nn.Parameter(torch.randn(11, generator=g))
            state[f"frozen{i}"] = torch.nn.Parameter(torch.randn(9, generator=g), requires_grad=False)
            state[f"np{i}"] = np.arange(13, dtype=">i4") * seed
            state[f"scalar{i}"] = torch.tensor(i, dtype=torch.int64)
        i += 1
    return state


def same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert list(a) == list(b)
    for k, x in a.items():
        y = b[k]
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray) and x.dtype == y.dtype and x.tobytes() == y.tobytes(), k
        else:
            assert x.dtype == y.dtype and x.shape == y.shape, k
            xb, yb = (
                t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)
                for t in (x, y)
            )
            assert torch.equal(xb, yb), k


def gaps_are_zero(folder: Path) -> None:
    """Every byte of the data file outside the tensors' own is zero (docs/format.md)."""
    doc = json.loads((folder / "manifest.json").read_bytes())
    data = np.fromfile(folder / "data-0.bin", dtype=np.uint8)
    mask = np.ones(len(data), dtype=bool)
    for e in doc["tensors"]:
        mask[e["offset"] : e["offset"] + e["nbytes"]] = False
    assert not data[mask].any(), "padding holds bytes other than zero"


def newest(root: Path) -> Path:
    return Path(list_checkpoints(open_storage(str(root)))[-1].url)


def test_sync_and_async_saves_of_many_mixed_tensors_are_bitwise_with_zero_padding(tmp_path: Path) -> None:
    first, second = mixed_state(1), mixed_state(2)
    save(first, str(tmp_path / "sync"), step=1)
    same(first, load(str(tmp_path / "sync")).state)
    gaps_are_zero(newest(tmp_path / "sync"))

    # The async saver reuses its host buffer: the second snapshot's padding lies where the
    # first one had data (other sizes), and must be zero again.
    saver = AsyncSaver(str(tmp_path / "async"), keep_last=None)
    try:
        saver.save(second, step=1).wait(60)
        saver.save(first, step=2).wait(60)
    finally:
        saver.close()
    same(first, load(str(tmp_path / "async")).state)
    gaps_are_zero(newest(tmp_path / "async"))
    verify(open_storage(str(tmp_path / "async")), newest(tmp_path / "async").name)


def test_the_manifest_is_its_canonical_form_one_tensor_a_line(tmp_path: Path) -> None:
    state = {f"t{i}": torch.full((3,), float(i)) for i in range(50)}
    save(state, str(tmp_path / "ck"), step=1, meta={"note": 'a "},{"dtype": line'})
    raw = (newest(tmp_path / "ck") / "manifest.json").read_bytes()
    doc = json.loads(raw)
    body = {k: v for k, v in doc.items() if k != "checksum"}
    assert written_checksum(raw) == doc["checksum"] == manifest_checksum(body)
    lines = raw.decode().splitlines()
    assert sum(line.startswith('{"dtype":') for line in lines) == 49  # the first follows "tensors":[
    assert lines[-1] == f'"checksum":"{doc["checksum"]}"}}'
    assert json.loads(raw.replace(b"\n", b"")) == doc
    assert load(str(tmp_path / "ck")).manifest["meta"] == {"note": 'a "},{"dtype": line'}


def old_manifest_bytes(body: dict[str, Any]) -> bytes:
    """The manifest as ferry wrote it before issue 17 (json's indent=1), kept as the
    fixture of the old layout: the data files are unchanged."""
    return json.dumps(dict(body, checksum=manifest_checksum(body)), indent=1).encode()


def test_a_checkpoint_in_the_old_layout_loads_bitwise(tmp_path: Path) -> None:
    state = mixed_state(3)
    save(state, str(tmp_path / "ck"), step=4, meta={"epoch": 2})
    folder = newest(tmp_path / "ck")
    doc = json.loads((folder / "manifest.json").read_bytes())
    old = old_manifest_bytes({k: v for k, v in doc.items() if k != "checksum"})
    (folder / "manifest.json").write_bytes(old)
    assert written_checksum(old) is None  # verified the old way: the body serialized again
    loaded = load(str(tmp_path / "ck"))
    assert loaded.step == 4 and loaded.manifest["meta"] == {"epoch": 2}
    same(state, loaded.state)

    damaged = old.replace(b'"epoch": 2', b'"epoch": 3')
    (folder / "manifest.json").write_bytes(damaged)
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        load(str(folder))


@pytest.mark.parametrize(
    ("before", "after"),
    [(b'"nbytes":12,', b'"nbytes":13,'), (b'"step":5,', b'"step":6,'), (b'"b":{', b'"c":{')],
)
def test_a_damaged_manifest_fails_both_checksum_paths(tmp_path: Path, before: bytes, after: bytes) -> None:
    save({"a": torch.ones(3), "b": torch.zeros(2)}, str(tmp_path / "ck"), step=5)
    path = newest(tmp_path / "ck") / "manifest.json"
    raw = path.read_bytes()
    assert before in raw
    path.write_bytes(raw.replace(before, after, 1))
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        read_manifest(open_storage(str(tmp_path / "ck")), path.parent.name)


def test_tensor_records_a_newer_writer_extended_still_load(tmp_path: Path) -> None:
    """A record with a field this ferry does not know goes through the full schema check,
    which drops the field, as it drops unknown top-level fields."""
    state = {"a": torch.arange(5), "b": torch.ones(2, 2)}
    save(state, str(tmp_path / "ck"), step=1)
    folder = newest(tmp_path / "ck")
    doc = json.loads((folder / "manifest.json").read_bytes())
    body = {k: v for k, v in doc.items() if k != "checksum"}
    for e in body["tensors"]:
        e["compression"] = "none"
    (folder / "manifest.json").write_bytes(old_manifest_bytes(body))
    loaded = load(str(tmp_path / "ck"))
    assert "compression" not in loaded.manifest["tensors"][0]
    same(state, loaded.state)


def test_the_collector_is_paused_only_during_a_save_or_load(tmp_path: Path) -> None:
    class Watch:
        """Records whether the collector was on when the engine asked for its state."""

        def __init__(self) -> None:
            self.seen: list[bool] = []

        def state_dict(self) -> dict[str, Any]:
            self.seen.append(gc.isenabled())
            return {"x": torch.ones(2)}

        def load_state_dict(self, sd: dict[str, Any]) -> None:
            self.seen.append(gc.isenabled())

    watch = Watch()
    assert gc.isenabled()
    save({"w": watch}, str(tmp_path / "ck"), step=1)
    load(str(tmp_path / "ck"), into={"w": watch})
    # flattened while paused (its state dict also read while loading); restored after it
    assert watch.seen[0] is False and watch.seen[-1] is True
    assert gc.isenabled()
    gc.disable()
    try:
        save({"w": watch}, str(tmp_path / "ck"), step=2)
        load(str(tmp_path / "ck"))
        assert not gc.isenabled(), "a caller's choice to keep the collector off was undone"
    finally:
        gc.enable()


def test_a_deep_value_in_a_tensor_record_is_refused_on_the_fast_path(tmp_path: Path) -> None:
    """The tensor table's depth walk is left out when the checksum verifies from the bytes:
    a record that is not plain still has it, before the schema prints any of its values."""
    save({"a": torch.ones(3)}, str(tmp_path / "ck"), step=1)
    folder = newest(tmp_path / "ck")
    doc = json.loads((folder / "manifest.json").read_bytes())
    body = {k: v for k, v in doc.items() if k != "checksum"}
    body["tensors"][0]["dtype"] = "@@DEEP@@"
    canon = json.dumps(body, separators=(",", ":")).replace('"@@DEEP@@"', "[" * 250 + "]" * 250)
    digest = xxhash.xxh3_64_hexdigest(canon.encode())
    raw = (canon[:-1] + f',"checksum":"{digest}"}}').encode()
    assert written_checksum(raw) == digest
    (folder / "manifest.json").write_bytes(raw)
    with pytest.raises(CorruptCheckpointError, match="nests deeper than 200 levels"):
        read_manifest(open_storage(str(tmp_path / "ck")), folder.name)


GOOD = {"dtype": "float32", "shape": [4, 2], "nbytes": 32, "kind": "torch", "device": "cpu",
        "file": "data-0.bin", "offset": 64}  # fmt: skip
MUTATIONS: list[dict[str, Any]] = [
    {}, {"dtype": "float99"}, {"dtype": 5}, {"dtype": "<f4"}, {"kind": "jax"}, {"kind": None},
    {"kind": "numpy", "dtype": "<f4"}, {"kind": "numpy", "dtype": "|O"},
    {"kind": "numpy", "dtype": "float32"}, {"shape": []}, {"shape": [], "nbytes": 4},
    {"shape": [0, 3], "nbytes": 0}, {"shape": [0, 3]}, {"shape": [-1]}, {"shape": [True, 8]},
    {"shape": [8.0]}, {"shape": "8"}, {"shape": [2**40, 2**40, 0], "nbytes": 0},
    {"shape": [1] * 33, "nbytes": 4}, {"shape": [1] * 32, "nbytes": 4}, {"shape": [2**61], "nbytes": 2**63},
    {"nbytes": 31}, {"nbytes": True}, {"nbytes": 32.0}, {"offset": -64}, {"offset": 66}, {"offset": 2**20},
    {"offset": 4096 - 32}, {"offset": 4096 - 31}, {"offset": 2**64}, {"file": "other.bin"}, {"file": 3},
    {"device": "CUDA!"}, {"device": "cuda:0"}, {"device": 0}, {"device": ["cpu"]}, {"file": ["x"]},
    {"dtype": ["float32"]}, {"kind": ["torch"]}, {"shape": [[1]]}, {"extra": 1},
]  # fmt: skip


CASES = [(change, 4096) for change in MUTATIONS] + [({}, -1), ({}, "4096"), ({"offset": 0}, 2**63)]


@pytest.mark.parametrize(("change", "size"), CASES, ids=[f"{c} in {s!r}" for c, s in CASES])
def test_the_one_pass_record_check_accepts_exactly_what_the_two_checks_accept(
    change: dict[str, Any], size: object
) -> None:
    """A load checks the tensor records in one pass when they are plain and fit; anything
    else goes through the schema and ``check_tensors``, whose messages name the problem.
    The one pass must never accept what those refuse."""
    from ferry.format.manifest import check_tensors
    from ferry.format.records import fitting_records, plain_records

    record = {**GOOD, **change}
    records = [dict(GOOD, offset=0), record, dict(GOOD, offset=128)]
    files: dict[str, Any] = {"data-0.bin": {"size": size, "xxh3_64": "0" * 16}}
    try:
        ok = plain_records(records) is not None and type(size) is int and 0 <= size < 2**63
        if ok:
            check_tensors(records, files, "ck")  # type: ignore[arg-type]
    except (CorruptCheckpointError, UnsafeCheckpointError):
        ok = False
    assert (fitting_records(records, files) is not None) == ok


def runs_state() -> dict[str, Any]:
    """Small 1-D tensors of one dtype in a row (a run: one block), past ``LONGEST`` bytes, with
    every kind a run must copy as a copy would: a strided view, a lazily negated and a lazily
    conjugated one, a parameter that requires grad, bools; runs broken by a 0-d tensor, a
    2-D one, a dtype change, a big tensor and a numpy array."""
    g = torch.Generator().manual_seed(5)
    state: dict[str, Any] = {f"a{i}": torch.randn(1000 + i % 7, generator=g) for i in range(1200)}
    state["strided"] = torch.randn(40, generator=g)[::3]
    state["negated"] = torch._neg_view(torch.randn(17, generator=g))
    state["param"] = torch.nn.Parameter(torch.randn(9, generator=g))
    state["step"] = torch.tensor(3.0)
    state["square"] = torch.randn(5, 5, generator=g)
    state["b0"] = torch.randn(33, generator=g)
    state["flags"] = torch.rand(21, generator=g) > 0.5
    state["z0"] = torch.randn(6, dtype=torch.complex64, generator=g).conj()
    state["z1"] = torch.randn(3, dtype=torch.complex64, generator=g)
    state["big"] = torch.randn(PACK_MAX // 4 + 1, generator=g)
    state["c0"] = torch.randn(7, generator=g)
    state["np"] = np.arange(5, dtype="<f8")
    state["c1"] = torch.randn(3, generator=g)
    return state


def test_runs_of_small_tensors_are_one_block_and_load_bitwise(tmp_path: Path) -> None:
    state = runs_state()
    save(state, str(tmp_path / "sync"), step=1)
    saver = AsyncSaver(str(tmp_path / "async"), keep_last=None)
    try:
        saver.save(state, step=1).wait(60)
    finally:
        saver.close()
    for root in ("sync", "async"):
        same(state, load(str(tmp_path / root)).state)
        gaps_are_zero(newest(tmp_path / root))
    entries = read_manifest(open_storage(str(tmp_path / "sync")), newest(tmp_path / "sync").name)["tensors"]
    at = dict(zip(state, entries, strict=True))
    run = [at[f"a{i}"] for i in range(1200)] + [at["strided"], at["negated"], at["param"]]
    assert sum(e["nbytes"] for e in run) > RUN_LONGEST  # more than one block
    for e, f in itertools.pairwise(run):  # back to back: no padding inside a run
        assert f["offset"] == e["offset"] + e["nbytes"]
    # Small tensors of one dtype lie back to back, whatever their shape (a 0-d or 2-D one is
    # copied alone); a new dtype, a big tensor or a numpy array begins anew, aligned.
    follow = [("param", "step"), ("step", "square"), ("square", "b0"), ("z0", "z1")]
    assert all(at[b]["offset"] == at[a]["offset"] + at[a]["nbytes"] for a, b in follow)
    assert all(at[k]["offset"] % 64 == 0 for k in ("flags", "z0", "big", "c0", "np", "c1"))
