"""The multi-rank save protocol (engine/ranksave.py), with each rank a thread of this process
and the ranks' board a real torch.distributed store (a HashStore, as the job's TCPStore
serves it). What the protocol promises: a checkpoint is listed only once every rank's part
is durable; a failure on any rank fails the save on all, and the next save is whole."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from copygate import CopyGate

from ferry.engine import list_checkpoints, load
from ferry.engine.persist import CheckpointInfo
from ferry.engine.ranks import rank_part
from ferry.engine.ranksave import RankSaver
from ferry.errors import StorageError
from ferry.runtime.distributed import StoreBoard
from ferry.storage import open_storage


class Ranks:
    """Two ranks' savers on one root, with what each reported."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        board = StoreBoard(dist.HashStore())
        self.errors: list[list[str]] = [[], []]
        self.commits: list[list[int]] = [[], []]
        self.savers = [
            RankSaver(
                self.root,
                rank=r,
                world_size=2,
                board=board,
                keep_last=None,
                on_commit=lambda info, r=r: self.commits[r].append(info.step),
                on_error=lambda step, exc, r=r: self.errors[r].append(f"{step}: {exc}"),
                timeout=60,
            )
            for r in (0, 1)
        ]

    def listed(self) -> list[int]:
        return [ref.step for ref in list_checkpoints(open_storage(self.root))]

    def save_both(self, name: str, step: int, extra: list[dict[str, bytes] | None]) -> None:
        for r in (0, 1):
            self.savers[r].save(state(r, step), name=name, step=step, extra_files=extra[r])
        for saver in self.savers:
            saver.wait()


def state(rank: int, step: int) -> dict[str, Any]:
    return {"w": torch.full((1000,), float(rank * 100 + step)), "step": step}


def test_commit_waits_for_every_part_and_the_parts_load(tmp_path: Path) -> None:
    ranks = Ranks(tmp_path)
    first = ranks.savers[0].save(state(0, 5), name="s5", step=5)
    with pytest.raises(TimeoutError):
        first.wait(timeout=0.3)  # rank 1 has not saved yet: rank 0 cannot commit
    assert ranks.listed() == []
    ranks.savers[1].save(state(1, 5), name="s5", step=5, extra_files={"user/v.json": b"{}"})
    info: CheckpointInfo = first.wait(timeout=60)
    assert ranks.savers[1].wait() is not None
    assert ranks.listed() == [5] and ranks.commits == [[5], [5]] and ranks.errors == [[], []]
    loaded = load(info.url)
    assert torch.equal(loaded.state["w"], state(0, 5)["w"])
    assert torch.equal(rank_part(loaded, 1)["w"], state(1, 5)["w"])
    assert "rank-1/user/v.json" in loaded.manifest["files"]


def test_a_failure_on_one_rank_fails_the_save_on_every_rank_and_not_the_next(tmp_path: Path) -> None:
    ranks = Ranks(tmp_path)
    ranks.save_both("s5", 5, [None, None])
    ranks.save_both("s6", 6, [None, {"bad\0name": b"x"}])  # rank 1 cannot write this file
    assert ranks.listed() == [5]
    for r in (0, 1):
        (error,) = ranks.errors[r]  # reported once on each rank, naming the rank and the cause
        assert error.startswith("6: the checkpoint of step 6 was not committed: rank 1: ")
        assert "null" in error
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".staging")]  # aborted
    ranks.save_both("s7", 7, [None, None])
    assert ranks.listed() == [5, 7] and ranks.commits == [[5, 7], [5, 7]]


def test_a_blocking_save_raises_its_failure_on_every_rank(tmp_path: Path) -> None:
    ranks = Ranks(tmp_path)
    raised: list[str] = []

    def rank(r: int) -> None:
        extra = {"bad\0name": b"x"} if r == 0 else None
        try:
            ranks.savers[r].save(state(r, 3), name="s3", step=3, extra_files=extra, blocking=True)
        except StorageError as exc:
            raised.append(f"{r}: {exc}")

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(e[:51] for e in raised) == [
        "0: the checkpoint of step 3 was not committed: rank",
        "1: the checkpoint of step 3 was not committed: rank",
    ]
    assert ranks.errors == [[], []] and ranks.listed() == []  # a blocking save's error is its caller's
    for saver in ranks.savers:
        saver.close()


def test_deferred_copies_are_waited_for_and_a_tensor_changed_first_fails_every_rank(
    tmp_path: Path, copy_gate: CopyGate
) -> None:
    """``overlap_snapshot``: each rank's part is written once its deferred copies are done;
    a rank whose deferred tensor changed before ``copied`` fails the save on all ranks."""
    ranks = Ranks(tmp_path)
    big = [torch.full((1 << 18,), float(r)) for r in (0, 1)]  # 1 MiB: not packed at the safe point

    def save(step: int) -> None:
        for r in (0, 1):
            defer = {big[r].data_ptr(): f"rank {r}'s weight"}
            ranks.savers[r].save({"big": big[r], "step": step}, name=f"s{step}", step=step, defer=defer)

    copy_gate.open()
    save(1)
    for r in (0, 1):
        assert ranks.savers[r].copied() is None
        big[r].add_(10)  # the optimizer's step, after the copies
    for saver in ranks.savers:
        saver.wait()
    assert ranks.listed() == [1]
    loaded = load(str(tmp_path))
    assert torch.equal(loaded.state["big"], torch.zeros(1 << 18))
    assert torch.equal(rank_part(loaded, 1)["big"], torch.ones(1 << 18))

    copy_gate.close()
    save(2)
    big[1].mul_(2)  # rank 1 changes it before its copies were waited for
    copy_gate.open()
    assert ranks.savers[0].copied() is None
    assert "rank 1's weight changed in place" in str(ranks.savers[1].copied())
    for saver in ranks.savers:
        saver.wait()
    assert ranks.listed() == [1]
    for r in (0, 1):
        (error,) = ranks.errors[r]
        assert error.startswith("2: the checkpoint of step 2 was not committed: rank 1: rank 1's weight")
