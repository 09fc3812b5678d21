"""Faults on a local checkpoint root: a full disk, damaged files, crafted checkpoints.

A full disk is a real small filesystem (tmpfs, mounted for the test; needs root). Damage
is done to real files the way disks and people do it: a flipped byte, a truncated file.
Crafted checkpoints carry working code-execution payloads (each payload is first shown to
work when unpickled on purpose); loading must refuse them and the payload must never run.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from ferry.cli import main as cli
from ferry.engine import AsyncSaver, list_checkpoints, load, save, verify
from ferry.errors import CorruptCheckpointError, StorageError, UnsafeCheckpointError
from ferry.format.wire import manifest_bytes
from ferry.storage import open_storage

pytestmark = pytest.mark.integration

STEP1, STEP2 = "step-000000000001", "step-000000000002"


def make_model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    return model, opt


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_model(model: torch.nn.Module, want: dict[str, torch.Tensor]) -> None:
    for k, v in model.state_dict().items():
        assert torch.equal(v, want[k]), f"{k} differs from the expected checkpoint"


@pytest.fixture
def two_checkpoints(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A root with steps 1 and 2 of different models; returns (root, weights 1, weights 2)."""
    root = tmp_path / "ckpt"
    m1, o1 = make_model(1)
    save({"model": m1, "opt": o1, "step": 1}, str(root), step=1)
    m2, o2 = make_model(2)
    save({"model": m2, "opt": o2, "step": 2}, str(root), step=2)
    return root, snapshot(m1), snapshot(m2)


def cli_run(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def tensor_offset(root: Path, name: str, path: str) -> tuple[int, int]:
    """(offset, nbytes) in data-0.bin of the tensor at ``path`` of the state tree."""
    manifest = json.loads((root / name / "manifest.json").read_bytes())
    node = manifest["tree"]
    for part in path.split("/"):
        node = node[part]
    entry = manifest["tensors"][node["__tensor__"]]
    return int(entry["offset"]), int(entry["nbytes"])


# ---------------------------------------------------------------------------- full disk


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 8 MiB filesystem (tmpfs), mounted for the test and unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    mnt = tmp_path / "small disk"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_full_disk_fails_cleanly_and_keeps_the_previous_checkpoint(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = small_disk / "ckpt"
    good = {"w": torch.arange(256 * 1024, dtype=torch.float32)}  # 1 MiB
    save(good, str(root), step=1)
    free = free_bytes(small_disk)

    too_big = {"w": torch.ones(4 * 1024 * 1024)}  # 16 MiB on an 8 MiB disk
    with pytest.raises(StorageError) as err:
        save(too_big, str(root), step=2)
    message = str(err.value)
    assert "\n" not in message and "disk is full" in message, message

    # the same through the async saver: the error comes back at wait()
    saver = AsyncSaver(str(root), keep_last=None)
    with pytest.raises(StorageError, match="disk is full"):
        saver.save(too_big, step=3).wait(timeout=60)
    with pytest.raises(StorageError):
        saver.close()  # the failed save in flight is reported once more, then the saver is done

    assert [r.step for r in list_checkpoints(open_storage(str(root)))] == [1]
    assert os.listdir(root) == [STEP1], "a failed save left files behind"
    assert free_bytes(small_disk) == free, "the failed saves did not give their space back"
    verify(open_storage(str(root)), STEP1)
    loaded = load(str(root))
    assert loaded.step == 1 and torch.equal(loaded.state["w"], good["w"])
    assert cli_run("verify", str(root)).exit_code == 0


def test_full_disk_at_the_manifest(small_disk: Path) -> None:
    """The data fits, the manifest does not: the failure comes after the data is durable."""
    root = small_disk / "ckpt"
    save({"v": torch.zeros(8)}, str(root), step=1)
    state = {"w": torch.full((256 * 1024,), 3.0)}  # exactly 1 MiB of data: 256 pages
    filler = small_disk / "filler"
    with open(filler, "wb") as f:  # leave room for the data file and not one page more
        f.write(b"\0" * (free_bytes(small_disk) - (1 << 20)))
    with pytest.raises(StorageError, match=r"manifest\.json: the disk is full"):
        save(state, str(root), step=2)
    assert [r.step for r in list_checkpoints(open_storage(str(root)))] == [1]
    assert os.listdir(root) == [STEP1]
    filler.unlink()
    save(state, str(root), step=2)  # with space again, saving works
    assert torch.equal(load(str(root)).state["w"], state["w"])


# ---------------------------------------------------------------------------- damaged files


def damage_flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


def damage_truncate(path: Path, offset: int) -> None:
    os.truncate(path, offset)


@pytest.mark.parametrize(
    ("damage", "why"), [(damage_flip, "checksum mismatch"), (damage_truncate, "truncated")]
)
def test_damaged_data_file_is_detected_and_loading_falls_back(
    two_checkpoints: tuple[Path, dict[str, torch.Tensor], dict[str, torch.Tensor]],
    caplog: pytest.LogCaptureFixture,
    damage: Any,
    why: str,
) -> None:
    root, weights1, _ = two_checkpoints
    offset, nbytes = tensor_offset(root, STEP2, "model/state/0.weight")  # a big tensor
    damage(root / STEP2 / "data-0.bin", offset + nbytes // 2)
    storage = open_storage(str(root))

    with pytest.raises(CorruptCheckpointError, match=why):
        verify(storage, STEP2)
    verify(storage, STEP1)
    for args in (["verify", str(root)], ["verify", str(root / STEP2)], ["verify", "--all", str(root)]):
        result = cli_run(*args)
        assert result.exit_code == CorruptCheckpointError.exit_code, (args, result.output)
        assert "BAD" in result.output and why in result.output
    assert cli_run("verify", str(root / STEP1)).exit_code == 0
    ferry_bin = Path(sys.executable).with_name("ferry")
    if ferry_bin.exists():  # and as an operator runs it
        done = subprocess.run([str(ferry_bin), "verify", str(root)], capture_output=True, text=True)
        assert done.returncode == CorruptCheckpointError.exit_code, done.stdout + done.stderr

    # into live objects: the damaged step is skipped for step 1, saying which and why, and
    # the live tensors (read into in place) end up holding step 1 exactly
    model, opt = make_model(3)
    caplog.set_level(logging.WARNING, logger="ferry")
    loaded = load(str(root), into={"model": model, "opt": opt, "step": 0})
    assert loaded.step == 1 and loaded.url == str(root / STEP1)
    warnings = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert STEP2 in warnings and why in warnings and "fell back" in warnings, warnings
    assert_model(model, weights1)

    with pytest.raises(CorruptCheckpointError, match=why):
        load(str(root), fallback=False)
    with pytest.raises(CorruptCheckpointError, match=why):
        load(str(root / STEP2))  # a named checkpoint: no fallback


def test_damaged_manifest_and_missing_file_fall_back(
    two_checkpoints: tuple[Path, dict[str, torch.Tensor], dict[str, torch.Tensor]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    root, weights1, _ = two_checkpoints
    manifest = root / STEP2 / "manifest.json"
    text = manifest.read_text()
    damaged = json.dumps({**json.loads(text), "step": 3})  # valid JSON, wrong checksum
    manifest.write_text(damaged)
    caplog.set_level(logging.WARNING, logger="ferry")
    model, opt = make_model(4)
    assert load(str(root), into={"model": model, "opt": opt, "step": 0}).step == 1
    assert "manifest checksum mismatch" in caplog.text
    assert_model(model, weights1)

    manifest.write_text(text)
    (root / STEP2 / "data-0.bin").unlink()
    caplog.clear()
    assert load(str(root)).step == 1
    assert "data-0.bin is missing" in caplog.text
    (root / STEP1 / "manifest.json").unlink()  # now nothing is intact
    with pytest.raises(CorruptCheckpointError):
        load(str(root))


# ---------------------------------------------------------------------------- crafted checkpoints


class Payload:
    """Unpickling this creates ``marker``: what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    """The file a payload would create; the payload is first shown to work on a twin."""
    twin = tmp_path / f"control-{uuid.uuid4().hex}"
    pickle.loads(pickle.dumps(Payload(twin)))  # shows the payload works
    assert twin.exists(), "the payload does not work, so its absence would prove nothing"
    path = tmp_path / f"pwned-{uuid.uuid4().hex}"
    yield path
    assert not path.exists(), "a crafted checkpoint ran code"


def rewrite_manifest(folder: Path, change: Any) -> None:
    """Edit a manifest the way an attacker would: change it, then recompute its checksum."""
    doc = json.loads((folder / "manifest.json").read_bytes())
    doc.pop("checksum")
    change(doc)
    (folder / "manifest.json").write_bytes(manifest_bytes(doc))


def torch_save_bytes(obj: Any) -> bytes:
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"ferry-craft-{uuid.uuid4().hex}.pt"
    try:
        torch.save(obj, path)
        return path.read_bytes()
    finally:
        path.unlink(missing_ok=True)


def set_tree(tree: Any) -> Any:
    return lambda doc: doc.__setitem__("tree", tree)


def set_entry(**fields: Any) -> Any:
    return lambda doc: doc["tensors"][0].update(fields)


CRAFTED: dict[str, tuple[Any, type[Exception], str]] = {
    # name: (how the manifest is changed, the error, words of its message)
    "reduce tag": (
        lambda m: set_tree({"x": {"__reduce__": ["pathlib.Path.touch", [str(m)]]}}),
        UnsafeCheckpointError,
        "unknown tag",
    ),
    "stateful os.system": (
        lambda m: set_tree({"__stateful__": "os.system"}),
        CorruptCheckpointError,
        "malformed manifest tree",
    ),
    "object dtype": (lambda m: set_entry(dtype="object"), UnsafeCheckpointError, "unknown tensor dtype"),
    "numpy object dtype": (
        lambda m: set_entry(kind="numpy", dtype="|O"),
        UnsafeCheckpointError,
        "not a number type",
    ),
    "path outside": (
        lambda m: lambda doc: doc["files"].__setitem__("../../outside.bin", {"size": 1, "xxh3_64": "0"}),
        CorruptCheckpointError,
        "outside the checkpoint folder",
    ),
    "tensor past its file": (
        lambda m: set_entry(offset=1 << 40),
        CorruptCheckpointError,
        "lies outside its file",
    ),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_manifest_is_refused_and_runs_nothing(
    two_checkpoints: tuple[Path, dict[str, torch.Tensor], dict[str, torch.Tensor]],
    marker: Path,
    caplog: pytest.LogCaptureFixture,
    case: str,
) -> None:
    root, weights1, _ = two_checkpoints
    change, error, words = CRAFTED[case]
    rewrite_manifest(root / STEP2, change(marker))
    with pytest.raises(error, match=words):
        load(str(root / STEP2))
    with pytest.raises(error, match=words):
        verify(open_storage(str(root)), STEP2)
    assert cli_run("verify", str(root)).exit_code == CorruptCheckpointError.exit_code
    caplog.set_level(logging.WARNING, logger="ferry")
    model, opt = make_model(5)
    assert load(str(root), into={"model": model, "opt": opt, "step": 0}).step == 1
    assert STEP2 in caplog.text
    assert_model(model, weights1)


def test_stateful_tag_names_no_code_to_run(
    two_checkpoints: tuple[Path, dict[str, torch.Tensor], dict[str, torch.Tensor]], marker: Path
) -> None:
    """With its state present, a ``__stateful__`` node is just that state: the type name
    is a label, never looked up."""
    root, _, _ = two_checkpoints
    rewrite_manifest(root / STEP2, set_tree({"__stateful__": "os.system", "state": f"touch {marker}"}))
    assert load(str(root / STEP2)).state == f"touch {marker}"


@pytest.mark.parametrize("kind", ["pickle", "torch.save"])
def test_manifest_replaced_by_a_pickle_is_refused(
    two_checkpoints: tuple[Path, dict[str, torch.Tensor], dict[str, torch.Tensor]],
    marker: Path,
    caplog: pytest.LogCaptureFixture,
    kind: str,
) -> None:
    root, _, _ = two_checkpoints
    blob = pickle.dumps(Payload(marker)) if kind == "pickle" else torch_save_bytes({"x": Payload(marker)})
    (root / STEP2 / "manifest.json").write_bytes(blob)
    with pytest.raises(UnsafeCheckpointError, match="never unpickles"):
        load(str(root / STEP2))
    for args in (["verify", str(root)], ["inspect", str(root)], ["inspect", "--all", str(root)]):
        assert cli_run(*args).exit_code != 0, args
    caplog.set_level(logging.WARNING, logger="ferry")
    assert load(str(root)).step == 1
    assert "never unpickles" in caplog.text


def test_data_file_replaced_by_a_pickle_is_never_unpickled(
    two_checkpoints: tuple[Path, dict[str, torch.Tensor], dict[str, torch.Tensor]], marker: Path
) -> None:
    root, _, _ = two_checkpoints
    import xxhash

    blob = pickle.dumps(Payload(marker))
    (root / STEP2 / "data-0.bin").write_bytes(blob)
    with pytest.raises(CorruptCheckpointError, match="bytes, manifest says"):
        load(str(root / STEP2))

    # even with a manifest made to match the pickle, its bytes are only ever raw tensor data
    def describe_blob(doc: dict[str, Any]) -> None:
        doc["files"]["data-0.bin"] = {"size": len(blob), "xxh3_64": xxhash.xxh3_64_hexdigest(blob)}
        entry = {"dtype": "uint8", "shape": [len(blob)], "nbytes": len(blob), "kind": "torch", "offset": 0}
        doc["tensors"] = [dict(entry, device="cpu", file="data-0.bin")]
        doc["tree"] = {"weights": {"__tensor__": 0}}

    rewrite_manifest(root / STEP2, describe_blob)
    loaded = load(str(root / STEP2))
    assert bytes(loaded.state["weights"].numpy()) == blob


def test_cli_on_a_root_without_checkpoints(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = cli_run("verify", str(tmp_path / "empty"))
    assert result.exit_code != 0 and "no committed checkpoint" in result.output


def test_leftover_staging_does_not_confuse_loading(
    two_checkpoints: tuple[Path, dict[str, torch.Tensor], dict[str, torch.Tensor]],
) -> None:
    """A crashed save's staging folder, complete but uncommitted, is never loaded."""
    root, _, _ = two_checkpoints
    shutil.copytree(root / STEP2, root / ".staging-step-000000000009-0badf00d")
    assert [r.step for r in list_checkpoints(open_storage(str(root)))] == [1, 2]
    assert load(str(root)).step == 2
