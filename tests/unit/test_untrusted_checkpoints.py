"""Checkpoints as untrusted input: what a crafted or damaged checkpoint folder gets, one case
each (the fuzzer, tests/integration/test_fuzz_checkpoints.py, tries thousands at random).

Loading a root falls back from a newest checkpoint that is wrong in any way to the older
good one; links and special files are refused, never followed, and nothing about the
files they point at ends up in a message."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ferry.engine import load, save, verify
from ferry.errors import CorruptCheckpointError, UnsafeCheckpointError
from ferry.format.wire import manifest_checksum
from ferry.storage import open_storage

STEP1, STEP2 = "step-000000000001", "step-000000000002"


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    """A read that blocks (a FIFO) fails the test instead of hanging the suite."""

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError("the read hung")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def state(seed: float) -> dict[str, Any]:
    return {"w": torch.full((4, 4), seed), "model": torch.nn.Linear(2, 2), "n": int(seed)}


def craft(folder: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Edit the manifest of ``folder`` and recompute its checksum, as an attacker can."""
    doc = json.loads((folder / "manifest.json").read_text())
    doc.pop("checksum")
    edit(doc)
    (folder / "manifest.json").write_text(json.dumps({**doc, "checksum": manifest_checksum(doc)}))


def _scalar_out_of_range(ck: Path) -> None:
    craft(ck, lambda d: d["tree"].update(n={"__npscalar__": "|u1", "value": -1}))


def _bad_device(ck: Path) -> None:
    craft(ck, lambda d: d["tree"].update(n={"__device__": "cuda:99999999999"}))


def _tensor_as_index_true(ck: Path) -> None:
    craft(ck, lambda d: d["tree"].update(w={"__tensor__": True}))


def _data_is_a_fifo(ck: Path) -> None:
    (ck / "data-0.bin").unlink()
    os.mkfifo(ck / "data-0.bin")


def _manifest_is_a_fifo(ck: Path) -> None:
    (ck / "manifest.json").unlink()
    os.mkfifo(ck / "manifest.json")


def _manifest_is_a_folder(ck: Path) -> None:
    (ck / "manifest.json").unlink()
    (ck / "manifest.json").mkdir()


def _symlink_loop(ck: Path) -> None:
    (ck / "data-0.bin").unlink()
    (ck / "data-0.bin").symlink_to("data-0.bin")


def _huge_tensor(ck: Path) -> None:
    def edit(d: dict[str, Any]) -> None:
        d["tensors"][0].update(shape=[2**37], nbytes=2**40, dtype="float64", offset=0)
        d["files"]["data-0.bin"]["size"] = 2**40

    craft(ck, edit)


def _state_that_does_not_fit(ck: Path) -> None:
    """A consistent checkpoint whose model has another shape: its load_state_dict raises."""
    save({"w": torch.zeros(4, 4), "model": torch.nn.Linear(3, 5), "n": 0}, str(ck.parent / "other"), step=2)
    os.rename(ck.parent / "other" / STEP2, ck.parent / "tmp")
    os.rename(ck, ck.parent / "gone")
    os.rename(ck.parent / "tmp", ck)


DAMAGE = {
    "numpy scalar out of range": _scalar_out_of_range,
    "device string": _bad_device,
    "tensor index true": _tensor_as_index_true,
    "data file is a FIFO": _data_is_a_fifo,
    "manifest is a FIFO": _manifest_is_a_fifo,
    "manifest is a folder": _manifest_is_a_folder,
    "symlink loop": _symlink_loop,
    "tensor of a TiB": _huge_tensor,
    "state that does not fit": _state_that_does_not_fit,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_whatever_is_wrong_with_the_newest_the_older_good_one_is_loaded(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "ck"
    save(state(1.0), str(root), step=1)
    save(state(2.0), str(root), step=2)
    DAMAGE[damage](root / STEP2)
    with pytest.raises(CorruptCheckpointError) as info:
        load(str(root / STEP2), into=state(0.0))
    assert "\n" not in str(info.value)
    live = state(0.0)
    loaded = load(str(root), into=live)
    assert loaded.step == 1
    assert torch.equal(live["w"], torch.full((4, 4), 1.0))
    if damage != "state that does not fit":  # a good checkpoint, of other objects
        with pytest.raises(CorruptCheckpointError):
            verify(open_storage(str(root)), STEP2)


def test_a_data_file_linked_to_an_identical_copy_outside_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    save(state(1.0), str(root), step=1)
    data = root / STEP1 / "data-0.bin"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(data.read_bytes())
    data.unlink()
    data.symlink_to(outside)
    with pytest.raises(UnsafeCheckpointError, match="symbolic link"):
        load(str(root), fallback=False)
    with pytest.raises(UnsafeCheckpointError, match="symbolic link"):
        verify(open_storage(str(root)), STEP1)


def test_a_checkpoint_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    save(state(1.0), str(tmp_path / "real"), step=1)
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / STEP1).symlink_to(tmp_path / "real" / STEP1)
    with pytest.raises(UnsafeCheckpointError, match="symbolic link"):
        load(str(tmp_path / "ck"), fallback=False)


def test_a_folder_linked_to_the_root_leaks_no_file_and_no_size(tmp_path: Path) -> None:
    """``sub -> /`` and a manifest listing ``sub/etc/passwd`` with its true size and hash:
    refused, and the message does not say how big the file outside is."""
    import xxhash

    root = tmp_path / "ck"
    save(state(1.0), str(root), step=1)
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 12345)
    (root / STEP1 / "sub").symlink_to(tmp_path)
    entry = {"size": 999, "xxh3_64": xxhash.xxh3_64_hexdigest(secret.read_bytes())}
    craft(root / STEP1, lambda d: d["files"].update({"sub/secret": entry}))
    with pytest.raises(UnsafeCheckpointError, match="symbolic link") as info:
        load(str(root), fallback=False)
    assert "12345" not in str(info.value)


def test_a_deeply_nested_tree_is_refused_before_it_is_walked(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    save(state(1.0), str(root), step=1)
    nested: Any = 1
    for _ in range(300):
        nested = [nested]
    craft(root / STEP1, lambda d: d["tree"].update(n=nested))
    with pytest.raises(CorruptCheckpointError, match="nests deeper"):
        load(str(root), fallback=False)


def test_dcp_reads_only_files_the_manifest_lists_and_verified(tmp_path: Path) -> None:
    """Sharded state: nothing may sit in ``dcp/`` that the manifest does not list (and the
    load did not verify), nothing but regular files, and never DCP's pickled ``.metadata``."""
    from ferry.engine.sharded import check_listed

    root = tmp_path / "ck"
    files = {"dcp/metadata.json": b"meta", "dcp/shards-0.bin": b"shard"}
    save(state(1.0), str(root), step=1, extra_files=files)
    dcp = root / STEP1 / "dcp"
    check_listed(str(dcp))
    (dcp / "shards-1.bin").write_bytes(b"planted")
    with pytest.raises(UnsafeCheckpointError, match="not a file the manifest lists"):
        check_listed(str(dcp))
    (dcp / "shards-1.bin").unlink()
    (dcp / "shards-0.bin").unlink()
    (dcp / "shards-0.bin").symlink_to(tmp_path)
    with pytest.raises(UnsafeCheckpointError):
        check_listed(str(dcp))

    bare = tmp_path / "bare"
    save(state(1.0), str(bare), step=1, extra_files={"dcp/shards-0.bin": b"shard"})
    with pytest.raises(UnsafeCheckpointError, match=r"metadata\.json is not listed"):
        check_listed(str(bare / STEP1 / "dcp"))
    (bare / STEP1 / "dcp" / ".metadata").write_bytes(b"\x80\x04planted pickle")
    with pytest.raises(UnsafeCheckpointError, match="pickled description"):
        check_listed(str(bare / STEP1 / "dcp"))


@pytest.mark.parametrize(
    "node",
    [{"__stateful__": {"__dict__": "ab"}, "state": {}}, {"__tensor__": 0, "__dict__": [[1]]}],
    ids=["stateful label not a string", "a tag with other keys"],
)
def test_tagged_objects_are_exactly_what_ferry_writes(tmp_path: Path, node: dict[str, Any]) -> None:
    """What ``ferry inspect`` walks is what loading decodes: nothing hides beside a tag."""
    from ferry.engine import read_manifest

    root = tmp_path / "ck"
    save(state(1.0), str(root), step=1)
    craft(root / STEP1, lambda d: d["tree"].update(n=node))
    with pytest.raises(UnsafeCheckpointError):
        read_manifest(open_storage(str(root)), STEP1)
