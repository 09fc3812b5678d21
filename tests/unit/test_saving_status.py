"""Progress of a save in flight: the writer's count (ferry.progress.Tally), the status field
the worker publishes (``saving``, parsed defensively), what ``ferry status`` computes from it
and the line a waiting command draws (ops.requests.SaveLine). End to end, through a pseudo-
terminal: tests/integration/test_save_progress.py."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from ferry.ops.requests import SaveLine
from ferry.progress import Tally, counting, written
from ferry.runtime.jobdir import JobDir
from ferry.runtime.jobfiles import parse_status
from ferry.session.savewatch import SaveWatch

GOOD = {"step": 7, "bytes": 10, "total": 30, "started": 1700000000.5}


def parsed(saving: object) -> tuple[dict[str, Any], list[str]]:
    dropped: list[str] = []
    status = parse_status({"state": "running", "step": 7, "saving": saving}, dropped.append)
    assert status["state"] == "running" and status["step"] == 7  # the rest is kept
    return dict(status), dropped


def test_a_well_formed_save_is_read() -> None:
    status, dropped = parsed(GOOD)
    assert status["saving"] == GOOD and dropped == []


@pytest.mark.parametrize(
    "saving",
    [
        {**GOOD, "bytes": -1},
        {**GOOD, "total": -5, "bytes": -6},
        {**GOOD, "step": -1},
        {**GOOD, "bytes": 31},  # more written than the total: a reader would draw 103%
        {**GOOD, "started": 0},
        {**GOOD, "started": -3.0},
        {**GOOD, "started": "yesterday"},
        {**GOOD, "bytes": True},
        {**GOOD, "total": 1 << 70},
        {**GOOD, "bytes": 1.5},
        {k: v for k, v in GOOD.items() if k != "total"},
        [1, 2, 3],
        "saving",
        None,
    ],
)
def test_a_hostile_save_is_left_out(saving: object) -> None:
    status, dropped = parsed(saving)
    assert "saving" not in status and len(dropped) == 1 and "saving" in dropped[0], (status, dropped)


def test_bytes_are_counted_only_on_the_thread_that_saves() -> None:
    tally = Tally()
    written(5)  # no save: nothing counts
    with counting(tally, 3, 100):
        assert tally.active and tally.step == 3 and tally.total == 100
        written(10)
        other = threading.Thread(target=written, args=(1000,))  # a remote copy, say
        other.start()
        other.join()
        written(20)
    assert not tally.active and tally.done == 30 and tally.serial == 1
    written(7)
    assert tally.done == 30
    with counting(None, 3, 100):  # a saver without a tally
        written(1)


def test_a_short_save_is_never_published(tmp_path: Path) -> None:
    job = JobDir.create("j", str(tmp_path / "j"))
    job.update_status("running", step=1)
    before = (tmp_path / "j" / "status.json").stat().st_ino
    tally = Tally()
    watch = SaveWatch(job, tally)
    for _ in range(20):
        with counting(tally, 1, 100):
            written(100)
    watch.close()
    assert (tmp_path / "j" / "status.json").stat().st_ino == before  # not rewritten
    assert "saving" not in job.status()


class Recording:
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def start(self, what: str, total: int, elapsed: float = 0.0) -> None:
        self.calls.append(("start", (what, total, elapsed > 0)))

    def advance(self, nbytes: int) -> None:
        self.calls.append(("advance", nbytes))

    def finish(self) -> None:
        self.calls.append(("finish", None))


def test_the_line_follows_the_published_save() -> None:
    meter = Recording()
    line = SaveLine(meter)
    line.show(None)
    assert meter.calls == [] and not line.drawn
    line.show({**GOOD, "bytes": 10})
    line.show({**GOOD, "bytes": 10})
    line.show({**GOOD, "bytes": 25})
    assert line.drawn
    line.show({**GOOD, "started": GOOD["started"] + 9, "step": 8, "bytes": 4})  # the next save
    line.end(complete=True)
    line.end(complete=True)  # once
    assert meter.calls == [
        ("start", ("saving step 7", 30, True)),  # its throughput counts from the save's start
        ("advance", 10),
        ("advance", 0),  # a redraw: the time goes on
        ("advance", 15),
        ("finish", None),  # that save ended: it stays as it was last seen
        ("start", ("saving step 8", 30, True)),
        ("advance", 4),
        ("advance", 26),  # committed: drawn whole
        ("finish", None),
    ]
