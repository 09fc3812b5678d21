"""Issue 20: the pure parts of a warm migration, from tables: when the warm worker may take
over (``supervisor.decide.hand_over_now``), when the preflight sends a migration the cold way
(``ops.warmcheck.cold_reason``), what ``FERRY_WARM`` may hold (``runtime.warmstart.parse``),
and how the report draws the overlap (``ops.report.build``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from ferry.errors import ConfigError
from ferry.ops import report
from ferry.ops.warmcheck import WarmFacts, cold_reason
from ferry.ops.warmresume import BundleGate
from ferry.runtime.events import Event
from ferry.runtime.jobdir import JobDir
from ferry.runtime.warmstart import WarmFds, parse
from ferry.supervisor import warm
from ferry.supervisor.decide import hand_over_now

GPU1 = {"CUDA_VISIBLE_DEVICES": "1"}
MiB, GiB = 2**20, 2**30


def now(**changes: Any) -> bool:
    """hand_over_now for a worker that started at 10 and committed its move's checkpoint at 20,
    with one of two restarts used, unless ``changes`` say otherwise."""
    known: dict[str, Any] = {
        "state": "checkpointed", "restart": GPU1, "updated": 20.0, "worker_started": 10.0,
        "warm_env": GPU1, "warm_ready": True, "stopping": False, "restarts": 1, "max_restarts": 2,
    }  # fmt: skip
    return hand_over_now(**{**known, **changes})


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, True),
        ({"state": "checkpointing"}, False),  # still saving: the state is not handed over yet
        ({"state": "running"}, False),
        ({"updated": 5.0}, False),  # a checkpointed status of the worker before this one
        ({"restart": None}, False),  # a plain stop: the exit decides
        ({"restart": {"CUDA_VISIBLE_DEVICES": "2"}}, False),  # a restart for another move
        ({"restart": "1"}, False),  # not an env at all
        ({"warm_ready": False}, False),
        ({"stopping": True}, False),  # a stop signal came: the warm worker is discarded
        ({"restarts": 2}, False),  # no restart left: the old worker's exit ends the run
    ],
)
def test_the_warm_worker_takes_over_once_the_old_one_committed_for_the_move(
    changes: dict[str, Any], expected: bool
) -> None:
    assert now(**changes) is expected


@pytest.mark.parametrize(
    ("facts", "words"),
    [
        (WarmFacts(), None),
        (WarmFacts(mem_available=4 * GiB, worker_rss=900 * MiB, state_bytes=1 * GiB), None),
        (WarmFacts(launcher="torchrun"), "runs under torchrun"),
        (WarmFacts(world_size=4), "one of 4 ranks"),
        (WarmFacts(mem_available=1 * GiB, worker_rss=900 * MiB, state_bytes=200 * MiB), "host memory"),
        (WarmFacts(mem_available=None, worker_rss=900 * GiB), None),  # unknown: not refused
        (WarmFacts(gpu_needed=10 * GiB, gpu_free={"1": 40 * GiB}), None),
        (WarmFacts(gpu_needed=10 * GiB, gpu_free={"1": 40 * GiB, "2": 5 * GiB}), "GPU 2 has 5.0 GiB free"),
        (WarmFacts(gpu_needed=0, gpu_free={"1": 0}), None),  # a CPU job needs no device memory
    ],
)
def test_the_preflight_says_why_it_goes_cold(facts: WarmFacts, words: str | None) -> None:
    reason = cold_reason(facts)
    if words is None:
        assert reason is None
    else:
        assert reason is not None and words in reason and "\n" not in reason


@pytest.mark.parametrize("value", ["", "1,2,3", "1,2,3,4,5", "a,b,c,d", "-1,2,3,4", "1,2,3,99999999"])
def test_a_bad_ferry_warm_is_a_one_line_error(value: str) -> None:
    with pytest.raises(ConfigError, match="FERRY_WARM"):
        parse(value)


def test_ferry_warm_round_trips() -> None:
    fds = WarmFds(go=3, ready=4, out=5, err=6)
    assert parse(fds.to_env()) == fds


def ev(time: float, event: str, **fields: object) -> Event:
    return {"time": time, "event": event, **fields}  # type: ignore[typeddict-item]


def test_the_report_draws_the_overlap_and_the_take_over() -> None:
    events = [
        ev(0.0, "run_start"),
        ev(0.1, "worker_start", pid=10, warm=False),
        ev(2.0, "training_start", step=0),
        ev(3.0, "warm_start", pid=11),
        ev(5.0, "warm_discarded", pid=11, reason="killed"),
        ev(6.0, "warm_start", pid=12),
        ev(9.0, "stop", step=40, url="ck/step-40", exit_code=85),
        ev(9.1, "worker_start", pid=12, warm=True),
        ev(9.1, "restart", pid=12, warm=True, reason="requested", env=GPU1, downtime_seconds=0.1),
        ev(9.2, "resume", step=40, url="ck/step-40"),
        ev(9.5, "worker_exit", pid=10, returncode=85),  # the old worker's teardown ends later
        ev(12.0, "worker_exit", pid=12, returncode=0),
    ]
    tl = report.build("j", events, {"state": "finished", "step": 60, "updated": 12.0})
    assert tl.overlaps == [{"start": 3.0, "end": 5.0}, {"start": 6.0, "end": 9.1}]
    assert tl.startups == [{"start": 0.1, "end": 2.0}, {"start": 9.1, "end": 9.2}]
    assert [m["kind"] for m in tl.marks] == ["migration"]  # the stop was the migration's: one mark
    assert tl.marks[0]["time"] == 9.0 and "warm hand-over CUDA_VISIBLE_DEVICES=1" in tl.marks[0]["text"]
    assert tl.down == []  # the warm worker took over before the old one exited: no gap


def test_warm_requests_are_taken_once_and_malformed_ones_refused(tmp_path: Path) -> None:
    job = JobDir.create("j", str(tmp_path / "j"))
    rid = warm.submit(job, GPU1, expires=60.0)
    bad = {"garbled": b"{not json", "no-env": b'{"expires": 5}', "no-expiry": b'{"env": {}}',
           "inf": b'{"env": {}, "expires": 1e999}',
           "number-env": b'{"env": {"A": 1}, "expires": 5}'}  # fmt: skip
    for name, raw in bad.items():
        (Path(job.control) / f"warm-{name}.json").write_bytes(raw)
    os.symlink(tmp_path, Path(job.control) / "warm-link.json")
    taken = warm.take_requests(job)
    good = [r for r in taken if isinstance(r, warm.WarmRequest)]
    refused = {r[0]: r[1] for r in taken if isinstance(r, tuple)}
    assert good == [warm.WarmRequest(rid, GPU1, 60.0)]
    assert set(refused) == {*bad, "link"} and all("refused" in why for why in refused.values())
    assert warm.take_requests(job) == [] and not list(Path(job.control).glob("warm-*"))


def test_the_warm_resume_gate_waits_for_the_bundle_and_refuses_another_command(tmp_path: Path) -> None:
    said: list[str] = []
    gate = BundleGate(str(tmp_path / "bundle"), str(tmp_path / "ck"), ["python", "train.py"], said.append)
    assert gate.poll() is None  # no bundle yet: wait on
    (tmp_path / "bundle").mkdir()
    doc = {"checkpoint": "checkpoints/step-000000000007", "command": ["python", "other.py"], "job": "a"}
    (tmp_path / "bundle" / "bundle.json").write_text(json.dumps(doc))
    why = gate.poll()
    assert why and "another command" in why and "ferry resume" in why and gate.bundle is None
    (tmp_path / "bundle" / "bundle.json").write_text("{garbled")
    why = gate.poll()
    assert why and "unusable" in why
