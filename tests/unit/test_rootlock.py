"""The lock of a checkpoint root (issue 13): a second job on a root a live job writes is
refused with exit 8, naming the holder; the lock leaves no trace in a root that got nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry.errors import JobError
from ferry.runtime.rootlock import LOCK_NAME, RootLock


def test_a_held_root_is_refused_to_another_job_naming_the_holder(tmp_path: Path) -> None:
    root = str(tmp_path / "ck")
    held = RootLock.acquire(root, "first")
    assert held is not None
    with pytest.raises(JobError, match="being written by the live job first") as refused:
        RootLock.acquire(root, "second")
    assert refused.value.exit_code == 8
    (tmp_path / "ck" / "step-000000000001").mkdir()  # it saved something: the lock file stays
    held.release()
    again = RootLock.acquire(root, "second")
    assert again is not None and (tmp_path / "ck" / LOCK_NAME).read_text() == "second"
    again.release()


def test_a_root_that_got_nothing_is_left_as_it_was_found(tmp_path: Path) -> None:
    lock = RootLock.acquire(str(tmp_path / "a" / "b" / "ck"), "j")
    assert lock is not None and (tmp_path / "a" / "b" / "ck" / LOCK_NAME).exists()
    lock.release()
    assert list(tmp_path.iterdir()) == []
    existing = tmp_path / "mine"
    existing.mkdir()
    lock = RootLock.acquire(str(existing), "j")
    assert lock is not None
    lock.release()
    assert existing.is_dir() and list(existing.iterdir()) == []


def test_remote_roots_are_not_locked() -> None:
    assert RootLock.acquire("s3://bucket/ck", "j") is None
