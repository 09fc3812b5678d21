"""The manifest is checked whole where it is read: every field's type and nesting, then what
the fields must mean together; each failure is one ferry error naming the field."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from ferry.errors import CorruptCheckpointError, UnsafeCheckpointError
from ferry.format.manifest import Manifest, decode_manifest, parse_manifest, parse_part
from ferry.format.wire import manifest_bytes

WHERE = "file:///ck/step-000000000007"


def good() -> dict[str, Any]:
    """A manifest as ferry writes it, without its checksum."""
    return {
        "format": "ferry-checkpoint",
        "version": 1,
        "step": 7,
        "created": 1700000000.5,
        "created_iso": "2023-11-14T22:13:20Z",
        "ferry_version": "0.1.0",
        "torch_version": "2.13.0",
        "python_version": "3.11.7",
        "host": "node-1",
        "pid": 4242,
        "world_size": 1,
        "files": {"data-0.bin": {"size": 128, "xxh3_64": "0123456789abcdef"}},
        "tensors": [
            {
                "dtype": "float32",
                "shape": [2, 3],
                "nbytes": 24,
                "kind": "torch",
                "device": "cuda:0",
                "file": "data-0.bin",
                "offset": 0,
            },
            {
                "dtype": "<f8",
                "shape": [4],
                "nbytes": 32,
                "kind": "numpy",
                "device": "cpu",
                "file": "data-0.bin",
                "offset": 64,
            },
        ],
        "tree": {"w": {"__tensor__": 0}, "a": {"__ndarray__": 1}, "n": {"__tuple__": [1, 2.5]}},
        "meta": {"epoch": 1},
    }


def sealed(body: dict[str, Any]) -> object:
    """``body`` with its checksum, as a reader decodes it from the file."""
    return json.loads(manifest_bytes(body))


def test_a_good_manifest_parses_to_its_fields() -> None:
    manifest: Manifest = parse_manifest(sealed(good()), WHERE)
    assert manifest == good()
    assert decode_manifest(manifest_bytes(good()), WHERE) == good()


def test_a_created_time_written_as_an_integer_is_a_float() -> None:
    body = dict(good(), created=1700000000)
    created = parse_manifest(sealed(body), WHERE)["created"]
    assert created == 1700000000.0 and isinstance(created, float)


def test_fields_a_newer_writer_adds_are_dropped() -> None:
    body = good()
    body["compression"] = "none"
    body["files"]["data-0.bin"]["mtime"] = 3
    body["tensors"][0]["requires_grad"] = True
    manifest = parse_manifest(sealed(body), WHERE)
    assert manifest == good()


REQUIRED = [k for k in good() if k != "format"]


@pytest.mark.parametrize("field", REQUIRED)
def test_each_missing_field_is_named(field: str) -> None:
    body = good()
    del body[field]
    words = "expected an integer, got None" if field == "version" else "missing"
    with pytest.raises(CorruptCheckpointError, match=f"malformed manifest: {field}: {words}"):
        parse_manifest(sealed(body), WHERE)


NESTED_MISSING = [
    (lambda d: d["files"]["data-0.bin"].pop("size"), "files.data-0.bin.size: missing"),
    (lambda d: d["files"]["data-0.bin"].pop("xxh3_64"), "files.data-0.bin.xxh3_64: missing"),
    (lambda d: d["tensors"][1].pop("offset"), r"tensors\[1\].offset: missing"),
    (lambda d: d["tensors"][0].pop("kind"), r"tensors\[0\].kind: missing"),
]


@pytest.mark.parametrize(("change", "words"), NESTED_MISSING)
def test_each_missing_nested_field_is_named(change: Callable[[dict[str, Any]], object], words: str) -> None:
    body = good()
    change(body)
    with pytest.raises(CorruptCheckpointError, match=words):
        parse_manifest(sealed(body), WHERE)


WRONG_TYPE: list[tuple[str, Callable[[dict[str, Any]], object], str]] = [
    # (name, how the manifest is changed, the field the message names)
    ("version str", lambda d: d.update(version="1"), "version"),
    ("step str", lambda d: d.update(step="7"), "step"),
    ("step bool", lambda d: d.update(step=True), "step"),
    ("step float", lambda d: d.update(step=7.0), "step"),
    ("step huge", lambda d: d.update(step=2**70), "step"),
    ("created str", lambda d: d.update(created="yesterday"), "created"),
    ("created bool", lambda d: d.update(created=False), "created"),
    ("created_iso int", lambda d: d.update(created_iso=3), "created_iso"),
    ("ferry_version null", lambda d: d.update(ferry_version=None), "ferry_version"),
    ("torch_version list", lambda d: d.update(torch_version=["2"]), "torch_version"),
    ("python_version int", lambda d: d.update(python_version=3), "python_version"),
    ("host dict", lambda d: d.update(host={}), "host"),
    ("pid str", lambda d: d.update(pid="4242"), "pid"),
    ("world_size float", lambda d: d.update(world_size=1.5), "world_size"),
    ("files list", lambda d: d.update(files=[]), "files"),
    ("file entry str", lambda d: d["files"].update({"data-0.bin": "128"}), "files.data-0.bin"),
    ("file size str", lambda d: d["files"]["data-0.bin"].update(size="128"), "files.data-0.bin.size"),
    ("file hash int", lambda d: d["files"]["data-0.bin"].update(xxh3_64=1), "files.data-0.bin.xxh3_64"),
    ("tensors dict", lambda d: d.update(tensors={}), "tensors"),
    ("tensor entry list", lambda d: d["tensors"].__setitem__(0, []), r"tensors\[0\]"),
    ("tensor dtype int", lambda d: d["tensors"][0].update(dtype=5), r"tensors\[0\].dtype"),
    ("tensor shape str", lambda d: d["tensors"][0].update(shape="2x3"), r"tensors\[0\].shape"),
    ("tensor dim str", lambda d: d["tensors"][0].update(shape=[2, "3"]), r"tensors\[0\].shape\[1\]"),
    ("tensor nbytes float", lambda d: d["tensors"][1].update(nbytes=32.0), r"tensors\[1\].nbytes"),
    ("tensor kind other", lambda d: d["tensors"][1].update(kind="pickle"), r"tensors\[1\].kind"),
    ("tensor device null", lambda d: d["tensors"][0].update(device=None), r"tensors\[0\].device"),
    ("tensor file int", lambda d: d["tensors"][0].update(file=0), r"tensors\[0\].file"),
    ("tensor offset str", lambda d: d["tensors"][1].update(offset="64"), r"tensors\[1\].offset"),
    ("meta list", lambda d: d.update(meta=[1]), "meta"),
]


@pytest.mark.parametrize(("name", "change", "field"), WRONG_TYPE, ids=[c[0] for c in WRONG_TYPE])
def test_each_field_of_the_wrong_type_is_named(
    name: str, change: Callable[[dict[str, Any]], object], field: str
) -> None:
    body = good()
    change(body)
    with pytest.raises(CorruptCheckpointError, match=f"{WHERE}: malformed manifest: {field}: ") as info:
        parse_manifest(sealed(body), WHERE)
    assert type(info.value) is CorruptCheckpointError
    assert "\n" not in str(info.value)


MEANING: list[tuple[str, Callable[[dict[str, Any]], object], type[Exception], str]] = [
    ("negative step", lambda d: d.update(step=-1), CorruptCheckpointError, "step -1"),
    ("no rank", lambda d: d.update(world_size=0), CorruptCheckpointError, "world_size 0"),
    (
        "path outside",
        lambda d: d["files"].update({"../x.bin": {"size": 1, "xxh3_64": "0"}}),
        CorruptCheckpointError,
        "outside the checkpoint folder",
    ),
    (
        "absolute path",
        lambda d: d["files"].update({"/etc/passwd": {"size": 1, "xxh3_64": "0"}}),
        CorruptCheckpointError,
        "outside the checkpoint folder",
    ),
    ("negative size", lambda d: d["files"]["data-0.bin"].update(size=-1), CorruptCheckpointError, "negative"),
    ("unknown file", lambda d: d["tensors"][0].update(file="x.bin"), CorruptCheckpointError, "names no file"),
    ("negative dim", lambda d: d["tensors"][0].update(shape=[-2, -3]), CorruptCheckpointError, "has shape"),
    ("negative offset", lambda d: d["tensors"][0].update(offset=-4), CorruptCheckpointError, "has offset"),
    ("wrong nbytes", lambda d: d["tensors"][0].update(nbytes=25), CorruptCheckpointError, "do not fit"),
    ("misaligned", lambda d: d["tensors"][1].update(offset=60), CorruptCheckpointError, "do not fit"),
    (
        "past its file",
        lambda d: d["tensors"][1].update(offset=1 << 40),
        CorruptCheckpointError,
        "outside its file",
    ),
    (
        "object dtype",
        lambda d: d["tensors"][0].update(dtype="object"),
        UnsafeCheckpointError,
        "unknown tensor dtype",
    ),
    (
        "numpy object",
        lambda d: d["tensors"][1].update(dtype="|O"),
        UnsafeCheckpointError,
        "not a number type",
    ),
    (
        "numpy garbage",
        lambda d: d["tensors"][1].update(dtype="zz"),
        UnsafeCheckpointError,
        "unknown array dtype",
    ),
    ("unknown tag", lambda d: d.update(tree={"__reduce__": 1}), UnsafeCheckpointError, "unknown tag"),
    ("missing tensor", lambda d: d.update(tree={"__tensor__": 2}), UnsafeCheckpointError, "missing tensor"),
    (
        "stateful no state",
        lambda d: d.update(tree={"__stateful__": "X"}),
        CorruptCheckpointError,
        "malformed manifest tree",
    ),
]


@pytest.mark.parametrize(("name", "change", "error", "words"), MEANING, ids=[c[0] for c in MEANING])
def test_fields_that_do_not_fit_together_are_refused(
    name: str, change: Callable[[dict[str, Any]], object], error: type[Exception], words: str
) -> None:
    body = good()
    change(body)
    with pytest.raises(error, match=words) as info:
        parse_manifest(sealed(body), WHERE)
    assert str(info.value).startswith(WHERE), "the error says which checkpoint"


def test_what_is_not_a_ferry_manifest_is_refused() -> None:
    with pytest.raises(UnsafeCheckpointError, match="not a ferry checkpoint manifest"):
        parse_manifest([good()], WHERE)
    with pytest.raises(UnsafeCheckpointError, match="not a ferry checkpoint manifest"):
        parse_manifest(sealed(dict(good(), format="other")), WHERE)
    with pytest.raises(UnsafeCheckpointError, match="never unpickles"):
        decode_manifest(pickle.dumps(good()), WHERE)
    with pytest.raises(CorruptCheckpointError, match="not valid JSON"):
        decode_manifest(b'{"format": "ferry-checkpoint", ', WHERE)


def test_a_newer_version_asks_for_an_upgrade() -> None:
    with pytest.raises(CorruptCheckpointError, match="upgrade ferry"):
        parse_manifest(sealed(dict(good(), version=2)), WHERE)


def test_a_changed_field_breaks_the_checksum() -> None:
    doc = sealed(good())
    assert isinstance(doc, dict)
    doc["step"] = 8
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        parse_manifest(doc, WHERE)
    del doc["checksum"]
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        parse_manifest(doc, WHERE)


def test_the_parsed_manifest_is_not_the_raw_document() -> None:
    """Callers may keep the manifest: later changes to the decoded JSON do not reach it."""
    raw = sealed(good())
    manifest = parse_manifest(raw, WHERE)
    assert isinstance(raw, dict)
    raw["files"]["data-0.bin"]["size"] = -5
    assert manifest["files"]["data-0.bin"]["size"] == 128


# ---------------------------------------------------------------------------- rank parts

FILES = {"rank-1.bin": {"size": 64, "xxh3_64": "0"}}
PART = {
    "tree": {"w": {"__tensor__": 0}},
    "tensors": [{"dtype": "int64", "shape": [8], "nbytes": 64, "kind": "torch", "device": "cpu",
                 "file": "rank-1.bin", "offset": 0}],
}  # fmt: skip


def test_a_rank_part_is_checked_like_a_manifest() -> None:
    assert parse_part(copy.deepcopy(PART), FILES, WHERE) == PART  # type: ignore[arg-type]
    bad = copy.deepcopy(PART)
    bad["tensors"][0]["nbytes"] = "64"  # type: ignore[index]
    with pytest.raises(CorruptCheckpointError, match=r"tensors\[0\].nbytes"):
        parse_part(bad, FILES, WHERE)  # type: ignore[arg-type]
    with pytest.raises(CorruptCheckpointError, match="tree: missing"):
        parse_part({"tensors": []}, FILES, WHERE)
    with pytest.raises(CorruptCheckpointError, match="outside its file"):
        parse_part(PART, {"rank-1.bin": {"size": 8, "xxh3_64": "0"}}, WHERE)
