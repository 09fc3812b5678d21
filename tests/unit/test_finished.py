"""Issue 30: a finished job's record in its checkpoint root (runtime/finished.py). The same
command line is done; another one (more epochs, a new --job-id on the same --dir) goes on
from the root's newest checkpoint with a warning, and the record goes; --fresh deletes the
checkpoints and the record; no record without a checkpoint (nothing left behind)."""

from __future__ import annotations

from pathlib import Path

import torch

from ferry.engine import list_checkpoints, save
from ferry.runtime.finished import FINISHED, read_finished, start_over, verdict, write_finished
from ferry.storage import open_storage

COMMAND = ["python", "train.py", "--epochs", "3"]


def test_the_record_the_same_command_and_another(tmp_path: Path) -> None:
    root = str(tmp_path / "ck")
    assert write_finished(root, job="j", step=24, command=COMMAND) is None
    assert not (tmp_path / "ck").exists()  # no checkpoint: no record, no folder left behind
    for step in (8, 16):
        save({"w": torch.zeros(2)}, root, step=step)
    assert verdict(root, COMMAND) is None
    assert write_finished(root, job="j", step=24, command=COMMAND) is None
    record = read_finished(root)
    assert record is not None and (record["job"], record["step"], record["command"]) == ("j", 24, COMMAND)

    same = verdict(root, COMMAND)
    assert (
        same is not None and same.done and "job j finished at step 24" in same.line and "--fresh" in same.line
    )
    assert (tmp_path / "ck" / FINISHED).exists()  # it stays: the job is still finished

    more = verdict(root, [*COMMAND[:-1], "4"])
    assert more is not None and not more.done
    assert "with another command line (python train.py --epochs 3)" in more.line
    assert "goes on from its newest checkpoint, step 16, and may train steps after it again" in more.line
    assert read_finished(root) is None  # the root is the new command's now

    assert write_finished(root, job="j", step=16, command=COMMAND) is None
    line = start_over(root)
    assert (
        line == f"ferry run: --fresh: starting over (deleted 2 checkpoint(s), of step(s) 8, 16 under {root})"
    )
    assert list_checkpoints(open_storage(root)) == [] and read_finished(root) is None


def test_a_record_that_is_not_ferrys_is_ignored(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    save({"w": torch.zeros(2)}, str(root), step=1)
    for junk in (b"not json", b'{"job": 3}', b"x" * (70 << 10)):
        (root / FINISHED).write_bytes(junk)
        assert read_finished(str(root)) is None and verdict(str(root), COMMAND) is None
