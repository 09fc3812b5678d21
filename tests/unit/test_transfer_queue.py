"""The copies to the remote when the remote is slower than the saves: a copy that had not
started gives way to a newer checkpoint's, the one being copied is held against the local
``keep_last``, a source removed meanwhile ends its copy without retries, and each retried
try is told as it fails. The remote is a folder; a push callback that waits on a gate
stands for a slow link."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
import torch

from ferry.engine import apply_retention, list_checkpoints, load, save
from ferry.engine.transfer import Superseded, Transfer, TransferError, TransferPolicy, copy_checkpoint
from ferry.storage import open_storage


def _saves(root: Path, steps: list[int]) -> list[str]:
    return [save({"w": torch.full((4,), float(s))}, str(root), step=s).url.rsplit("/", 1)[-1] for s in steps]


class SlowLink:
    """A push callback that copies for real once its gate opens; ``started`` is set when a
    copy is under way."""

    def __init__(self, local: Path) -> None:
        self.local = str(local)
        self.gate, self.started = threading.Event(), threading.Event()
        self.pushed: list[str] = []

    def __call__(self, direction: str, src: str, dst: str) -> None:
        name = src.rstrip("/").rsplit("/", 1)[-1]
        self.started.set()
        assert self.gate.wait(30)
        self.pushed.append(name)
        copy_checkpoint(open_storage(self.local), name, open_storage(dst), TransferPolicy(remote=dst))


def test_copies_not_started_give_way_to_the_newest_and_the_queue_stays_short(tmp_path: Path) -> None:
    local, remote = tmp_path / "local", tmp_path / "remote"
    first, *middle, last = _saves(local, [1, 2, 3, 4])
    link = SlowLink(local)
    transfer = Transfer(str(local), TransferPolicy(remote=str(remote), callback=link, retries=0))
    running = transfer.push(first)
    assert link.started.wait(30)
    skipped = [transfer.push(name) for name in middle]
    newest = transfer.push(last)
    link.gate.set()
    assert running.result(30).endswith(first) and newest.result(30).endswith(last)
    for handle in skipped:
        with pytest.raises(Superseded, match=last):
            handle.result(30)
    assert link.pushed == [first, last]
    assert [r.name for r in list_checkpoints(open_storage(str(remote)))] == [first, last]
    transfer.close()


def test_the_checkpoint_being_copied_outlives_keep_last_until_its_copy_ends(tmp_path: Path) -> None:
    local, remote = tmp_path / "local", tmp_path / "remote"
    (first,) = _saves(local, [1])
    link = SlowLink(local)
    transfer = Transfer(str(local), TransferPolicy(remote=str(remote), callback=link, retries=0))
    handle = transfer.push(first)
    assert link.started.wait(30)
    newer = _saves(local, [2, 3])
    storage = open_storage(str(local))
    # keep_last=1 would remove steps 1 and 2; step 1 is being copied and stays.
    assert apply_retention(storage, 1) == [newer[0]]
    link.gate.set()
    assert handle.result(30).endswith(first)
    assert torch.equal(load(handle.result()).state["w"], torch.full((4,), 1.0))
    # Its copy ended: the next retention removes it.
    assert apply_retention(storage, 1) == [first]
    assert [r.name for r in list_checkpoints(storage)] == [newer[1]]
    transfer.close()


def test_a_source_removed_meanwhile_fails_at_once_and_says_what_is_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local, remote = tmp_path / "local", tmp_path / "remote"
    old, new = _saves(local, [1, 2])
    apply_retention(open_storage(str(local)), 1)  # what `ferry prune` or a user's rm does
    retried: list[str] = []
    transfer = Transfer(str(local), TransferPolicy(remote=str(remote), backoff_seconds=5.0))
    handle = transfer.push(old, retried.append)
    with caplog.at_level(logging.ERROR, "ferry"), pytest.raises(TransferError, match="no longer a committed"):
        handle.result(10)  # no retry: five backoffs would take 75 s
    assert retried == [] and handle.failed == []
    message = caplog.records[-1].getMessage()
    assert "is kept" not in message and "next checkpoint's copy goes on" in message
    assert "times" not in message, "it was tried once"
    assert transfer.push(new).result(30).endswith(new)
    transfer.close()


def test_each_retried_try_is_told_as_it_fails(tmp_path: Path) -> None:
    local, remote = tmp_path / "local", tmp_path / "remote"
    (name,) = _saves(local, [1])
    tries: list[str] = []
    told: list[tuple[int, str]] = []

    def flaky(direction: str, src: str, dst: str) -> None:
        tries.append(src)
        if len(tries) < 3:
            raise OSError(f"refused ({len(tries)})")
        copy_checkpoint(open_storage(str(local)), name, open_storage(dst), TransferPolicy(remote=dst))

    policy = TransferPolicy(remote=str(remote), callback=flaky, backoff_seconds=0.01)
    transfer = Transfer(str(local), policy)
    handle = transfer.push(name, lambda what: told.append((len(tries), what)))
    assert handle.result(30).endswith(name)
    # Told after the first and after the second try, each before the next one ran.
    assert [n for n, _ in told] == [1, 2] and "refused (2)" in told[1][1]
    assert handle.failed == [what for _, what in told]
    transfer.close()
