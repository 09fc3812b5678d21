"""The commit transaction, on a local folder and on fsspec's memory://: a crash at any stage
of a save leaves no checkpoint and no staging folder; a commit makes it listed, whole.

The crash is a real backend that raises at one stage, wrapped around the real thing the
way a failing disk or server would make it fail: through the ``Storage`` calls only.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import xxhash

from ferry.engine import list_checkpoints, load, save
from ferry.errors import StorageError
from ferry.storage import FileRecord, LocalFiles, Storage, Transaction, open_storage, strategy_for
from ferry.storage.atomic import MANIFEST, MARKER

FINAL = "step-000000000001"
DATA = bytes(range(256)) * 4096  # 1 MiB
STAGES = ("begin", "write", "close", "manifest body", "manifest write", "sync", "commit", "caller")


class Crash(Exception):
    """The fault injected at one stage."""


class FaultyWriter:
    def __init__(self, inner: Any, stage: str) -> None:
        self._inner, self._stage = inner, stage

    def write(self, data: memoryview | bytes) -> None:
        if self._stage == "write":
            raise Crash("write")
        self._inner.write(data)

    def close(self) -> None:
        if self._stage == "close":
            raise Crash("close")
        self._inner.close()

    def abort(self) -> None:
        self._inner.abort()


class Faulty:
    """A real backend that raises ``Crash`` at one stage of a save, and works otherwise."""

    def __init__(self, inner: Storage, stage: str) -> None:
        self._inner, self._stage = inner, stage
        self.url = inner.url
        if isinstance(inner, LocalFiles):  # the capability only where the backend has it
            self.local_path = self._local_path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def makedirs(self, rel: str) -> None:
        if self._stage == "begin":
            raise Crash("makedirs")
        self._inner.makedirs(rel)

    def open_writer(self, rel: str) -> FaultyWriter:
        return FaultyWriter(self._inner.open_writer(rel), self._stage)

    def write_bytes(self, rel: str, data: bytes) -> None:
        name = rel.rsplit("/", 1)[-1]
        if (self._stage, name) in (("manifest write", MANIFEST), ("commit", MARKER)):
            raise Crash(f"write {rel}")
        self._inner.write_bytes(rel, data)

    def rename(self, src: str, dst: str) -> None:
        if self._stage == "commit":
            raise Crash(f"rename {src}")
        self._inner.rename(src, dst)

    def _local_path(self, rel: str) -> str:
        path: str = self._inner.local_path(rel)  # type: ignore[attr-defined]
        if self._stage == "sync" and "/" not in rel:  # the folder itself: the fsync before the commit
            raise Crash(f"fsync {rel}")
        return path


@pytest.fixture(params=["local", "memory"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "local":
        yield str(tmp_path / "ckpts")
        return
    url = f"memory://ferry-txn-{uuid.uuid4().hex[:8]}"
    yield url
    open_storage(url).remove("")


def manifest_of(files: dict[str, dict[str, Any]]) -> bytes:
    return json.dumps({"files": files}).encode()


def write_one(storage: Storage, stage: str = "", manifest: Callable[..., bytes] = manifest_of) -> str:
    with Transaction.begin(storage, FINAL) as txn:
        txn.add_file("data-0.bin", DATA)
        txn.add_file("sub/extra.bin", memoryview(b"extra"))
        txn.add_written("sub/by-another.bin", 0, xxhash.xxh3_64_hexdigest(b""))
        storage.write_bytes(txn.path("sub/by-another.bin"), b"")
        if stage == "caller":
            raise Crash("the caller's own failure")
        return txn.commit(manifest)


@pytest.mark.parametrize("stage", STAGES)
def test_a_crash_at_any_stage_leaves_nothing(root: str, stage: str) -> None:
    real = open_storage(root)
    if stage == "sync" and not isinstance(real, LocalFiles):
        pytest.skip("object stores have no folders to sync")

    def manifest(files: dict[str, dict[str, Any]]) -> bytes:
        if stage == "manifest body":
            raise Crash("manifest body")
        return manifest_of(files)

    with pytest.raises(Crash):
        write_one(Faulty(real, stage), stage, manifest)  # type: ignore[arg-type]
    assert list_checkpoints(real) == []
    assert real.listdir() == [], f"left behind after a crash at {stage}"
    assert not strategy_for(real).is_committed(real, FINAL)


def test_commit_makes_it_listed_and_whole(root: str) -> None:
    storage = open_storage(root)
    assert write_one(storage) == FINAL
    assert [r.name for r in list_checkpoints(storage)] == [FINAL]
    assert FINAL in storage.listdir() and not any(
        strategy_for(storage).is_staging(n) for n in storage.listdir()
    )
    files = json.loads(storage.read_bytes(f"{FINAL}/{MANIFEST}"))["files"]
    assert files == {
        "data-0.bin": {"size": len(DATA), "xxh3_64": xxhash.xxh3_64_hexdigest(DATA)},
        "sub/extra.bin": {"size": 5, "xxh3_64": xxhash.xxh3_64_hexdigest(b"extra")},
        "sub/by-another.bin": {"size": 0, "xxh3_64": xxhash.xxh3_64_hexdigest(b"")},
    }
    assert storage.read_bytes(f"{FINAL}/data-0.bin") == DATA


def test_a_joined_rank_adds_files_and_only_the_writer_commits(root: str) -> None:
    storage = open_storage(root)
    with Transaction.begin(storage, FINAL) as txn:
        other = Transaction.join(storage, txn.final, txn.staging)
        rec = other.add_file("rank-1.bin", b"rank one")
        with pytest.raises(StorageError, match="only the rank that began"):
            other.commit(b"{}")
        other.abort()  # a joined rank never removes the writer's folder
        txn.add_written("rank-1.bin", rec.size, rec.xxh3_64)
        txn.commit(manifest_of)
    assert [r.name for r in list_checkpoints(storage)] == [FINAL]
    assert json.loads(storage.read_bytes(f"{FINAL}/{MANIFEST}"))["files"]["rank-1.bin"]["size"] == 8


def test_a_copy_that_does_not_match_its_manifest_is_never_committed(root: str, tmp_path: Path) -> None:
    src = str(tmp_path / "src")
    info = save({"x": 1}, src, step=1)
    name = info.url.rsplit("/", 1)[-1]
    dst = open_storage(root)
    with pytest.raises(StorageError, match="differ from their source"), Transaction.begin(dst, name) as txn:
        txn.add_copy(open_storage(src), f"{name}/data-0.bin", "data-0.bin", FileRecord(1, "0" * 16))
    assert dst.listdir() == []
    assert load(src).step == 1


def test_missing_names_lost_files_and_raises_when_the_storage_cannot_answer(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file gone is missing; a storage that cannot be asked (a remote that is down) is no
    answer: the caller retries instead of reading every file as lost."""
    storage = open_storage(root)
    with Transaction.begin(storage, FINAL) as txn:
        txn.add_file("data-0.bin", DATA)
        txn.add_file("sub/extra.bin", memoryview(b"extra"))
        assert txn.missing() == []
        storage.remove(txn.path("sub/extra.bin"))
        assert txn.missing() == ["sub/extra.bin"]

        def down(rel: str) -> int:
            raise StorageError(f"cannot stat {rel}: connection refused")

        monkeypatch.setattr(storage, "size", down)
        with pytest.raises(StorageError, match="connection refused"):
            txn.missing()
        txn.abort()
