"""What saves cost the training thread. "Training blocked" is what it lost to a save: from
entering the safe point to leaving it, discovery and capture included, in the log, the
job's status and its events alike (discovery stands in here as a slow stub: a walk of a
big process's objects). Requests that come while a save is written wait for one save
after it, and training does not wait for them."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from torch import nn

from ferry.config import Config
from ferry.runtime.control import read_response, submit
from ferry.session import Session

SLOW = 0.3
"""Seconds the discovery stub takes: far above a snapshot of a few bytes."""


def _session(tmp_path: Path, **config: object) -> Session:
    return Session.start(
        Config(dir=str(tmp_path / "ck"), job_dir=str(tmp_path / "job"), job_id="b", **config)
    )


@pytest.mark.parametrize("async_save", [True, False])
def test_the_blocked_time_covers_discovery(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, async_save: bool
) -> None:
    session = _session(tmp_path, async_save=async_save)
    model = nn.Linear(4, 4)

    def slow_discovery() -> dict[str, object]:
        time.sleep(SLOW)
        return {"model": model}

    session.discover = slow_discovery
    caplog.set_level(logging.INFO, logger="ferry")
    session.request()
    t0 = time.perf_counter()
    session.step()  # a safe point that saves
    lost = time.perf_counter() - t0
    session.close()
    (record,) = session.job.status()["checkpoints"]
    blocked = record["blocking_seconds"]
    assert SLOW <= blocked <= lost + 0.05  # what the safe point took, no less
    if not async_save:  # a blocking save: training waited for the commit
        assert blocked >= record["seconds"]
    (event,) = [e for e in session.job.events() if e["event"] == "checkpoint"]
    assert event["blocking_seconds"] == blocked
    assert f"training blocked {blocked:.3f} s" in caplog.text


class _HeldCommit(logging.Handler):
    """Holds the saving thread as it reports a commit, until ``release``: a save still
    being written, for as long as the test needs, without a race against the clock."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()
        self.held = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("ferry: checkpoint step") and not self.released.is_set():
            self.held.set()
            assert self.released.wait(30)

    def let_go(self) -> None:  # (``release`` is the handler's lock's)
        self.released.set()


def test_requests_while_a_save_is_written_are_answered_by_one_save_after_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A burst of requests costs one save, and training never waits for the save in flight."""
    caplog.set_level(logging.INFO, logger="ferry")
    held = _HeldCommit()
    logging.getLogger("ferry").addHandler(held)
    session = _session(tmp_path, control_poll_seconds=1e-6)
    session.track(model=nn.Linear(4, 4))
    try:
        session.request()
        session.step()  # the first save, held in flight as it reports its commit
        assert held.held.wait(30)
        burst = [submit(session.job, "checkpoint") for _ in range(5)]
        for _ in range(3):
            session.step()  # safe points while it is written: none waits, none saves
        assert session.checkpointer.busy()
        held.let_go()
        deadline = time.monotonic() + 30
        while len(session.job.status().get("checkpoints", [])) < 2 and time.monotonic() < deadline:
            session.step()  # the next safe points: one save for the whole burst, once the
            time.sleep(0.01)  # last one's stall is its share of training (ASKED_SAVE_SHARE)
            session.checkpointer.wait()
    finally:
        held.let_go()
        logging.getLogger("ferry").removeHandler(held)
        session.close()
    first, second = (c["step"] for c in session.job.status()["checkpoints"])
    assert first == 1 and second > 4
    for rid in burst:
        answer = read_response(session.job, rid)
        assert answer is not None and answer["ok"] and answer["step"] == second
