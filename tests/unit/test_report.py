"""Issue 16: the report's timeline from events (pure, from tables), and the one clear line
when matplotlib is not installed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ferry.errors import ConfigError
from ferry.ops import figure, report
from ferry.ops.jobs import JobRecord
from ferry.runtime.atomicjson import write_json_atomic
from ferry.runtime.events import Event
from ferry.runtime.jobdir import JobDir
from ferry.runtime.jobfiles import Status


def ev(time: float, event: str, **fields: object) -> Event:
    return {"time": time, "event": event, **fields}  # type: ignore[typeddict-item]


def ckpt(time: float, step: int, url: str) -> Event:
    return ev(time, "checkpoint", step=step, url=url, seconds=0.5, blocking_seconds=0.1)


LIFE = [
    ev(0.0, "run_start"),
    ev(0.1, "worker_start", pid=10),
    ckpt(2.0, 0, "ck/step-0"),
    ckpt(3.0, 5, "ck/step-5"),
    ev(4.0, "worker_exit", pid=10, returncode=-9),
    ev(4.5, "worker_start", pid=11),
    ev(6.0, "resume", step=5, url="ck/step-5"),
    ev(7.0, "stop", step=8, url="ck/step-8", exit_code=77),
    ckpt(7.0, 8, "ck/step-8"),
    ev(7.2, "worker_exit", pid=11, returncode=77),
    ev(7.3, "run_end", state="checkpointed", exit_code=77),
]


@pytest.mark.parametrize(
    ("events", "status", "kinds"),
    [
        (LIFE, {"state": "checkpointed", "exit_code": 77}, ["failure", "stop"]),
        # the custom code known only from the status (an older session wrote no stop event)
        (
            [e for e in LIFE if e["event"] not in ("stop", "run_end")],
            {"state": "checkpointed", "exit_code": 77},
            ["failure"],
        ),
        # without any record of 77, it is a failure
        (
            [e for e in LIFE if e["event"] not in ("stop", "run_end")],
            {"state": "failed"},
            ["failure", "failure"],
        ),
        ([ev(0, "worker_start"), ev(1, "worker_exit", returncode=85)], {}, []),
        ([ev(0, "worker_start"), ev(1, "worker_exit", returncode=0)], {}, []),
    ],
)
def test_marks_and_custom_checkpoint_codes(events: list[Event], status: Status, kinds: list[str]) -> None:
    assert [m["kind"] for m in report.build("j", events, status).marks] == kinds


def test_startups_lost_work_and_deleted_checkpoints() -> None:
    tl = report.build(
        "j", LIFE, {"state": "checkpointed", "step": 8, "updated": 7.1}, exists=lambda u: u != "ck/step-0"
    )
    assert tl.startups == [{"start": 0.1, "end": 2.0}, {"start": 4.5, "end": 6.0}]
    assert tl.lost == [{"start": 3.0, "end": 4.0}] and tl.lost_seconds == 1.0
    assert [(c["step"], c["deleted"]) for c in tl.checkpoints] == [(0, True), (5, False), (8, False)]
    assert tl.segments == [[(2.0, 0), (3.0, 5)], [(6.0, 5), (7.0, 8), (7.0, 8), (7.1, 8)]]
    assert (tl.start, tl.end, tl.max_step) == (0.0, 7.3, 8)


def test_a_worker_without_a_step_zero_save_trains_from_its_start() -> None:
    tl = report.build("j", [ev(1.0, "worker_start"), ckpt(5.0, 10, "ck/a")], {"step": 12, "updated": 6.0})
    assert tl.startups == [] and tl.segments == [[(1.0, 0), (5.0, 10), (6.0, 12)]]


def test_training_start_ends_the_start_up_and_a_worker_dying_early_is_all_start_up() -> None:
    events = [
        ev(0.0, "worker_start"),
        ev(1.0, "worker_exit", returncode=1),
        ev(2.0, "worker_start"),
        ev(3.0, "resume", step=4, url="ck/a"),
        ev(3.5, "training_start", step=4),
        ckpt(5.0, 8, "ck/b"),
    ]
    tl = report.build("j", events, {"step": 9, "updated": 6.0})
    assert tl.startups == [{"start": 0.0, "end": 1.0}, {"start": 2.0, "end": 3.5}]
    assert tl.segments == [[(3.0, 4), (3.5, 4), (5.0, 8), (6.0, 9)]]
    assert [m["kind"] for m in tl.marks] == ["failure"] and tl.lost == []  # it never trained


def test_without_matplotlib_the_message_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ConfigError, match=r"pip install 'gpuferry\[report\]'"):
        figure.draw(report.Timeline("j"))


def test_the_figure_is_drawn_as_png_and_svg() -> None:
    pytest.importorskip("matplotlib")
    drawing = figure.draw(report.build("j", LIFE, {"state": "checkpointed", "step": 8, "updated": 7.1}))
    png, svg = figure.png(drawing), figure.svg(drawing)
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert svg.startswith("<svg") and "training step" in svg and "failure" in svg


def test_a_migration_is_one_mark_when_its_worker_stopped() -> None:
    """The worker's checkpoint-and-exit for a restart request is the migration, not a stop;
    a stop the job's user asked for stays a stop."""
    events = [
        ev(0.0, "run_start"),
        ev(0.1, "worker_start", pid=10),
        ev(1.0, "training_start", step=0),
        ev(3.0, "stop", step=9, url="ck/step-9", exit_code=85),
        ev(3.1, "worker_exit", pid=10, returncode=85),
        ev(4.0, "worker_start", pid=11),
        ev(4.0, "restart", pid=11, reason="requested", env={"CUDA_VISIBLE_DEVICES": "1"}, downtime_seconds=1),
        ev(5.0, "resume", step=9, url="ck/step-9"),
        ev(6.0, "stop", step=12, url="ck/step-12", exit_code=85),
        ev(6.1, "worker_exit", pid=11, returncode=85),
        ev(6.2, "run_end", state="checkpointed", exit_code=85),
    ]
    tl = report.build("j", events, {"state": "checkpointed", "step": 12, "updated": 6.1})
    marks = tl.marks
    assert [(m["kind"], m["time"]) for m in marks] == [("migration", 3.0), ("stop", 6.0)]
    assert tl.down == [{"start": 3.0, "end": 4.0}]  # from the stop: the worker exits, then none runs
    assert tl.last_status == (6.1, 12)
    assert "stopped at step 9" in marks[0]["text"] and "CUDA_VISIBLE_DEVICES=1" in marks[0]["text"]


@pytest.mark.parametrize(
    ("span", "unit"), [(0.5, "s"), (179, "s"), (180, "min"), (10799, "min"), (10800, "h")]
)
def test_the_time_axis_reads_in_a_unit_that_fits(span: float, unit: str) -> None:
    assert figure.time_unit(span)[0] == unit


def test_a_job_run_again_is_one_lineage_with_its_resume_marked(tmp_path: Path) -> None:
    """Issue 30: every run that wrote the job's checkpoint root, under any job id, is one
    report: the stop of the first and the resume of the next on one time axis."""
    first = [
        ev(0.0, "run_start"),
        ev(0.1, "worker_start", pid=10),
        ev(1.0, "training_start", step=0),
        ev(3.0, "stop", step=9, url="ck/step-9", exit_code=85),
        ev(3.1, "worker_exit", pid=10, returncode=85),
        ev(3.2, "run_end", state="checkpointed", exit_code=85),
    ]
    second = [
        ev(50.0, "run_start"),
        ev(50.1, "worker_start", pid=20),
        ev(52.0, "resume", step=9, url="ck/step-9"),
        ev(60.0, "worker_exit", pid=20, returncode=0),
        ev(60.1, "run_end", state="finished", exit_code=0),
    ]
    runs = {
        "host-1": ("/ck", first, 3.2),
        "train-ab12cd34": ("/ck", second, 60.1),
        "other": ("/x", first, 9.0),
    }
    for job_id, (root, events, ended) in runs.items():
        job = JobDir.create(job_id, str(tmp_path / job_id))
        job.write_identity(id=job_id, checkpoint_dir=root, created=events[0]["time"])
        lines = [json.dumps(e) for e in events]  # with the times of the table, not of now
        (tmp_path / job_id / "events.jsonl").write_text("\n".join(lines) + "\n")
        job.update_status("finished" if root == "/ck" and ended > 50 else "checkpointed", step=9)
        write_json_atomic(job.file("status.json"), {**job.status(), "updated": ended})
    records = [JobRecord.load(str(tmp_path / name)) for name in runs]
    lineage = report.lineage(records[1], records)
    assert [r.id for r in lineage] == ["host-1", "train-ab12cd34"]  # oldest first; not "other"
    events, status = report.merged(lineage)
    assert status["state"] == "finished"
    tl = report.build("train-ab12cd34", events, status)
    assert tl.runs == 2 and [m["kind"] for m in tl.marks] == ["stop", "resume"]
    assert tl.marks[1]["text"] == "run again: resumed at step 9"
    assert tl.down == [{"start": 3.0, "end": 50.1}]  # stopped until someone ran it again
    assert "1 stops,\n1 resumes" in report.page(tl, status, "<svg></svg>")
