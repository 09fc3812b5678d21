"""The manifest's fast path (``fitting_records``: the schema of the tensor records and
``check_tensors`` in one pass) accepts a tensor table only where the full check does: a
table test over the checkpoint fuzzer's manifest edits (tests/integration/fuzz_checkpoints.py,
``field_edit`` and ``tensor_edit``; its value tables are copied below) applied to a real
manifest, one edit at a time and every value of each table, rather than a random sample.

Two copies of one security rule stay one rule while this holds: whatever the fast path
lets through, the full check (``parse`` against the schema, then ``check_tensors``) lets
through too; and a manifest ferry wrote takes the fast path (it is not dead code)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fuzz_tables import DEVICES, DTYPES, FILES, HOSTILE, NBYTES, SHAPES

import ferry
from ferry.engine.codec import TORCH_DTYPES
from ferry.errors import FerryError
from ferry.format.manifest import Manifest, TensorRecord, check_tensors
from ferry.format.records import fitting_records, plain_records
from ferry.typedjson import SchemaError, check, parse

KINDS: list[Any] = ["numpy", "torch", "pickle", None]
RECORD_KEYS = ["dtype", "shape", "nbytes", "offset", "kind", "device", "file"]


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for name, dt in TORCH_DTYPES.items():
        base = torch.randn(7, 3, generator=g) * 50
        if dt.is_complex:
            tensors[name] = torch.complex(base, base.flip(0)).to(dt)
        elif dt == torch.bool:
            tensors[name] = base > 0
        else:
            tensors[name] = base.to(dt) if dt.is_floating_point else base.abs().to(torch.int64).to(dt)
    return {
        "tensors": tensors,
        "empty": torch.empty(0, 3),
        "zero_dim": torch.tensor(3.5),
        "non_contiguous": torch.arange(24.0).reshape(4, 6).t(),
        "arrays": [
            np.arange(10, dtype=">i4"),
            np.zeros((2, 0)),
            np.ones((3, 3), np.float32),
            np.array(True),
            np.array([1 + 2j, 3], np.complex128),
        ],
    }


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fastpath")
    ferry.save(_state(), str(root), step=1)
    (ck,) = [p for p in root.iterdir() if p.name.startswith("step-")]
    doc: dict[str, Any] = json.loads((Path(ck) / "manifest.json").read_text())
    return doc


def _edits(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(label, edited manifest): each of the fuzzer's edits of a tensor record or of the
    files table, one at a time, on a copy of ``doc``."""
    n = len(doc["tensors"])
    kinds = {e["kind"] for e in doc["tensors"]}
    empty = {i for i, e in enumerate(doc["tensors"]) if e["nbytes"] == 0}
    first_of_kind = {next(i for i, e in enumerate(doc["tensors"]) if e["kind"] == k) for k in kinds}
    picks = sorted({0, n - 1, *empty, *first_of_kind})
    size = doc["files"]["data-0.bin"]["size"]

    def edited(label: str, change: Any) -> tuple[str, dict[str, Any]]:
        d = copy.deepcopy(doc)
        change(d)
        return label, d

    def put(i: int, key: str, value: Any) -> Any:
        return lambda d: d["tensors"][i].__setitem__(key, value)

    yield edited("as written", lambda d: None)
    for i in picks:
        e = doc["tensors"][i]
        for v in DTYPES:
            yield edited(f"tensor {i} dtype {v!r}", put(i, "dtype", v))
        for v in SHAPES:
            yield edited(f"tensor {i} shape {v!r}", put(i, "shape", [e["nbytes"]] if v == NBYTES else v))
        for v in [0, 2**63 - 1, -1, e["nbytes"] + 1, e["nbytes"] * 2]:
            yield edited(f"tensor {i} nbytes {v}", put(i, "nbytes", v))
        for v in [2**63 - 1, -64, size, e["offset"] + 1, e["offset"] + 64, size - 64]:
            yield edited(f"tensor {i} offset {v}", put(i, "offset", v))
        for v in KINDS:
            yield edited(f"tensor {i} kind {v!r}", put(i, "kind", v))
        for v in DEVICES:
            yield edited(f"tensor {i} device {v!r}", put(i, "device", v))
        for v in FILES:
            yield edited(f"tensor {i} file {v!r}", put(i, "file", v))

        def huge(d: dict[str, Any], i: int = i) -> None:  # consistent with itself: 2**40 bytes
            t = d["tensors"][i]
            t["shape"], t["nbytes"], t["dtype"], t["kind"] = [2**37], 2**40, "float64", "torch"
            d["files"][t["file"]]["size"] = t["offset"] + 2**40

        yield edited(f"tensor {i} huge", huge)
        for j in picks:

            def swap(d: dict[str, Any], i: int = i, j: int = j) -> None:
                d["tensors"][i], d["tensors"][j] = d["tensors"][j], d["tensors"][i]

            yield edited(f"tensors {i} and {j} swapped", swap)
        for key in RECORD_KEYS:  # field_edit: any value of the fuzzer's at any field of a record
            for v in HOSTILE:
                yield edited(f"tensor {i} {key} = {v!r}", put(i, key, v))
            yield edited(f"tensor {i} without {key}", lambda d, i=i, key=key: d["tensors"][i].pop(key))
        yield edited(f"tensor {i} with one more field", put(i, "extra", 1))
        for v in HOSTILE:
            yield edited(f"tensor {i} = {v!r}", lambda d, i=i, v=v: d["tensors"].__setitem__(i, v))
    for v in HOSTILE:
        yield edited(f"tensors = {v!r}", lambda d, v=v: d.__setitem__("tensors", v))
        yield edited(f"files = {v!r}", lambda d, v=v: d.__setitem__("files", v))
        yield edited(f"file entry = {v!r}", lambda d, v=v: d["files"].__setitem__("data-0.bin", v))
        yield edited(f"file size = {v!r}", lambda d, v=v: d["files"]["data-0.bin"].__setitem__("size", v))
    for v in [0, 1, size - 1, size + 1, 2**40]:
        yield edited(f"file size {v}", lambda d, v=v: d["files"]["data-0.bin"].__setitem__("size", v))


def _full_check(doc: dict[str, Any]) -> bool:
    """What a manifest's tensor table goes through without the fast path: the schema, then
    ``check_tensors`` (the file names are checked on both paths alike, after either)."""
    try:
        m = parse({k: v for k, v in doc.items() if k != "checksum"}, Manifest)
        check_tensors(m["tensors"], m["files"], "ck")
    except (SchemaError, FerryError):
        return False
    return True


def test_the_fast_path_accepts_only_what_the_full_check_accepts(manifest: dict[str, Any]) -> None:
    outcomes: dict[tuple[bool, bool], list[str]] = {}
    for label, doc in _edits(manifest):
        fast = fitting_records(doc.get("tensors"), doc.get("files")) is not None
        outcomes.setdefault((fast, _full_check(doc)), []).append(label)
        if plain_records(doc.get("tensors")) is not None:  # the schema's own fast path agrees
            check(doc["tensors"], list[TensorRecord])  # with the schema: SchemaError otherwise
    assert not outcomes.get((True, False)), f"the fast path let through: {outcomes[(True, False)][:10]}"
    taken = outcomes.get((True, True), [])
    assert "as written" in taken and any("swapped" in label for label in taken)
    assert len(outcomes.get((False, False), [])) > 1000  # the table reaches the refusals
    # Where the full check accepts, the fast path does too, but for a record with a field the
    # schema does not declare (a newer writer's): the schema drops it, the fast path leaves it
    # to the schema. Any other decline would be a slow path that ferry's own manifests take.
    declined = outcomes.get((False, True), [])
    assert all(label.endswith("with one more field") for label in declined), declined[:10]
