"""The files of a job directory are parsed at the edge: readers get well-formed fields only,
a malformed field is left out with a log line, a malformed request is refused with an
answer; nothing malformed raises into the code that reads them."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ferry.errors import JobError
from ferry.runtime.atomicjson import write_json_atomic
from ferry.runtime.control import ControlInbox, Request, parse_request, submit, wait_response
from ferry.runtime.events import parse_event
from ferry.runtime.jobdir import MAX_DOC_BYTES, JobDir
from ferry.runtime.jobfiles import parse_identity, parse_response, parse_status

CHECKPOINT = {"step": 10, "url": "file:///ck/step-000000000010", "bytes": 4096, "seconds": 0.25,
              "blocking_seconds": 0.01, "time": 1700000100.0}  # fmt: skip

IDENTITY: dict[str, Any] = {
    "id": "exp1",
    "host": "node-1",
    "uid": 1000,
    "created": 1700000000.0,
    "user": "alice",
    "cwd": "/home/alice/run",
    "command": ["python", "train.py"],
    "argv": ["/usr/bin/python3", "train.py"],
    "checkpoint_dir": "/scratch/ck",
    "supervisor_pid": 4000,
    "worker_pid": 4001,
    "pid": 4001,
    "scheduler": "slurm",
    "scheduler_restarts": 2,
}

STATUS: dict[str, Any] = {
    "state": "running",
    "step": 12,
    "updated": 1700000200.5,
    "pid": 4001,
    "worker_pid": 4001,
    "supervisor_pid": 4000,
    "resumed_from": "file:///ck/step-000000000008",
    "url": "file:///ck/step-000000000010",
    "last_checkpoint": CHECKPOINT,
    "checkpoints": [CHECKPOINT],
    "exit_code": None,
    "error": None,
    "restart": {"CUDA_VISIBLE_DEVICES": "1"},
    "started": 1700000000.0,
    "ended": 1700000300.0,
    "worker_started": 1700000001.0,
    "restarts": 1,
    "max_restarts": 3,
    "failures": 0,
}

WRONG: dict[str, object] = {
    # a value of the wrong type for each type the documents use
    "str": 5,
    "int": "5",
    "float": "yesterday",
    "list[str]": "python train.py",
    "int | None": 4.5,
    "str | None": ["x"],
    "dict[str, str] | None": {"CUDA_VISIBLE_DEVICES": 1},
    "CheckpointRecord": dict(CHECKPOINT, step="10"),
    "list[CheckpointRecord]": [CHECKPOINT, {"step": 11}],
    "State": "sleeping",
}
KIND = {
    "id": "str", "host": "str", "uid": "int", "created": "float", "user": "str", "cwd": "str",
    "command": "list[str]", "argv": "list[str]", "checkpoint_dir": "str",
    "supervisor_pid": "int | None", "worker_pid": "int | None", "pid": "int", "scheduler": "str",
    "scheduler_restarts": "int", "state": "State", "step": "int", "updated": "float",
    "resumed_from": "str", "url": "str", "last_checkpoint": "CheckpointRecord",
    "checkpoints": "list[CheckpointRecord]", "exit_code": "int | None", "error": "str | None",
    "restart": "dict[str, str] | None", "started": "float", "ended": "float",
    "worker_started": "float", "restarts": "int", "max_restarts": "int", "failures": "int",
}  # fmt: skip


class Drops(list[str]):
    """What a parser left out, one line each."""

    def __call__(self, problem: str) -> None:
        assert "\n" not in problem
        self.append(problem)


Parser = Callable[[object, Callable[[str], None]], object]
DOCS: list[tuple[str, Parser, dict[str, Any]]] = [
    ("job.json", parse_identity, IDENTITY),
    ("status.json", parse_status, STATUS),
]


@pytest.mark.parametrize(("name", "parser", "good"), DOCS)
def test_a_good_document_parses_to_itself(name: str, parser: Parser, good: dict[str, Any]) -> None:
    drops = Drops()
    assert parser(json.loads(json.dumps(good)), drops) == good
    assert drops == []


@pytest.mark.parametrize(("name", "parser", "good"), DOCS)
def test_every_field_is_optional(name: str, parser: Parser, good: dict[str, Any]) -> None:
    """Both writers fill these files in steps: a missing field is no problem."""
    for field in good:
        drops = Drops()
        doc = {k: v for k, v in good.items() if k != field}
        assert parser(doc, drops) == doc
        assert drops == []


@pytest.mark.parametrize(("name", "parser", "good"), DOCS)
def test_fields_of_other_writers_are_dropped_quietly(name: str, parser: Parser, good: dict[str, Any]) -> None:
    drops = Drops()
    assert parser({**good, "gpu_model": "H100", "notes": [1, 2]}, drops) == good
    assert drops == []


CASES = [(name, parser, good, field) for name, parser, good in DOCS for field in good]


@pytest.mark.parametrize(("name", "parser", "good", "field"), CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_a_field_of_the_wrong_type_is_left_out_and_named(
    name: str, parser: Parser, good: dict[str, Any], field: str
) -> None:
    drops = Drops()
    parsed = parser({**good, field: WRONG[KIND[field]]}, drops)
    assert parsed == {k: v for k, v in good.items() if k != field}
    assert len(drops) == 1 and drops[0].startswith(f"{name}: {field}")


@pytest.mark.parametrize("field", ["pid", "worker_pid", "supervisor_pid"])
@pytest.mark.parametrize("value", [0, -1])
def test_a_pid_that_would_address_a_group_is_left_out(field: str, value: int) -> None:
    for parser, good in ((parse_identity, IDENTITY), (parse_status, STATUS)):
        drops = Drops()
        assert field not in parser({**good, field: value}, drops)
        assert drops == [f"{'job' if parser is parse_identity else 'status'}.json: {field}: {value} "
                         "is out of range; left out"]  # fmt: skip


@pytest.mark.parametrize(("name", "parser", "good"), DOCS)
@pytest.mark.parametrize("raw", [None, [1], "running", 3])
def test_a_document_that_is_not_an_object_is_empty(
    name: str, parser: Parser, good: dict[str, Any], raw: object
) -> None:
    drops = Drops()
    assert parser(raw, drops) == {}
    assert len(drops) == 1


def test_a_job_not_started_yet_reads_as_empty_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A controller polls status.json before the worker wrote it: nothing is wrong yet."""
    caplog.set_level(logging.WARNING)
    job = JobDir(str(tmp_path / "job"))
    assert job.status() == {} and job.identity() == {}
    assert caplog.records == []


# ---------------------------------------------------------------------------- events

EVENTS: list[dict[str, Any]] = [
    {"time": 1.0, "event": "run_start", "supervisor_pid": 4000, "command": ["python", "t.py"]},
    {"time": 2.0, "event": "worker_start", "pid": 4001, "restarts": 0, "failures": 0},
    {"time": 3.0, "event": "resume", "step": 8, "url": "file:///ck/a", "seconds": 0.5},
    {"time": 4.0, "event": "checkpoint", **{k: v for k, v in CHECKPOINT.items() if k != "time"}},
    {"time": 5.0, "event": "checkpoint_failed", "step": 11, "error": "disk full"},
    {"time": 6.0, "event": "remote_copy", "step": 10, "url": "s3://b/ck", "retried": 1},
    {"time": 6.5, "event": "remote_copy_failed", "step": 10, "name": "step-1", "retried": 3, "error": "x"},
    {"time": 6.2, "event": "remote_retry", "step": 10, "error": "copying data-0.bin: refused"},
    {"time": 6.7, "event": "remote_copy_skipped", "step": 10, "name": "step-1", "reason": "step-2 is newer"},
    {"time": 7.0, "event": "signal", "signal": "SIGTERM", "action": "stop"},
    {"time": 8.0, "event": "grace_kill", "signal": "SIGTERM", "grace_seconds": 30.0},
    {"time": 9.0, "event": "stop", "step": 12, "url": "file:///ck/b", "exit_code": 85},
    {"time": 10.0, "event": "worker_exit", "pid": 4001, "returncode": -9, "signal": "SIGKILL"},
    {"time": 11.0, "event": "restart", "reason": "requested", "pid": 4002, "downtime_seconds": 1.5,
     "env": {"CUDA_VISIBLE_DEVICES": "1", "OLD": None}, "step": 12},
    {"time": 12.0, "event": "restart", "reason": "failure", "pid": 4003, "downtime_seconds": 2.0,
     "returncode": 1, "backoff_seconds": 1.0},
    {"time": 13.0, "event": "run_end", "state": "finished", "exit_code": 0, "message": "done"},
    {"time": 14.0, "event": "warm_start", "pid": 4004, "env": {"CUDA_VISIBLE_DEVICES": "1"}},
    {"time": 15.0, "event": "warm_ready", "pid": 4004, "seconds": 3.5},
    {"time": 16.0, "event": "warm_discarded", "pid": 4004, "reason": "the job is stopping (SIGTERM)"},
    {"time": 17.0, "event": "worker_start", "pid": 4005, "restarts": 1, "failures": 0, "warm": True},
    {"time": 18.0, "event": "first_step", "step": 13, "seconds": 0.3, "next_seconds": 0.2},
]  # fmt: skip


@pytest.mark.parametrize("event", EVENTS, ids=[e["event"] for e in EVENTS])
def test_every_documented_event_parses_to_itself(event: dict[str, Any]) -> None:
    drops = Drops()
    assert parse_event(json.loads(json.dumps(event)), drops) == event
    assert drops == []


@pytest.mark.parametrize(
    "raw",
    [
        {"event": "stop"},
        {"time": 1.0},
        {"time": "1.0", "event": "stop"},
        {"time": 1.0, "event": 5},
        {"time": float("inf"), "event": "stop"},
        [1.0, "stop"],
        None,
    ],
)
def test_a_line_without_time_and_event_is_skipped(raw: object) -> None:
    drops = Drops()
    assert parse_event(raw, drops) is None
    assert len(drops) == 1 and drops[0].endswith("line skipped")


def test_an_event_keeps_its_good_fields() -> None:
    drops = Drops()
    parsed = parse_event({"time": 1, "event": "stop", "step": "12", "url": "u", "x": 1}, drops)
    assert parsed == {"time": 1.0, "event": "stop", "url": "u"}
    assert drops == ["events.jsonl: step: expected an integer or null, got str '12'; left out"]


# ---------------------------------------------------------------------------- answers and requests


def test_an_answer_is_checked_whole() -> None:
    good = {"id": "r1", "ok": True, "time": 5.0, "step": 3, "url": "u", "seconds": 0.1}
    assert parse_response(good, "resp-r1.json") == good
    assert parse_response({"id": "r1", "ok": False, "error": "no"}, "resp") == {
        "id": "r1",
        "ok": False,
        "error": "no",
    }
    for bad, field in [
        ({"ok": True}, "id"),
        ({"id": "r1"}, "ok"),
        ({"id": "r1", "ok": "yes"}, "ok"),
        ({"id": "r1", "ok": True, "step": "3"}, "step"),
        ([], "document"),
    ]:
        with pytest.raises(JobError, match=f"resp-r1.json is not a ferry answer .*{field}"):
            parse_response(bad, "resp-r1.json")


REQUEST = {"id": "r1", "action": "restart", "created": 1700000000.5, "uid": 1000, "env": {"A": "1"}}


def test_a_good_request_parses() -> None:
    assert parse_request("r1", REQUEST) == Request("r1", "restart", 1700000000.5, {"A": "1"})
    assert parse_request("r1", {**REQUEST, "priority": 3}) == parse_request("r1", REQUEST)
    assert parse_request("r1", {"action": "stop"}) == Request("r1", "stop", 0.0, None)
    assert parse_request("r1", {"action": "stop", "env": None}).env is None
    assert parse_request("r1", {"action": "stop", "created": 7}).created == 7.0


BAD_REQUESTS = [
    ({"id": 5}, "id"),
    ({"action": 3}, "action"),
    ({"created": "yesterday"}, "created"),
    ({"created": True}, "created"),
    ({"created": float("nan")}, "created"),
    ({"uid": "1000"}, "uid"),
    ({"env": ["A=1"]}, "env"),
    ({"env": {"A": 1}}, "env.A"),
]


@pytest.mark.parametrize(("change", "field"), BAD_REQUESTS, ids=[f for _, f in BAD_REQUESTS])
def test_a_request_with_a_bad_field_is_refused_naming_it(change: dict[str, object], field: str) -> None:
    with pytest.raises(JobError, match=f"request r1 refused: malformed {field}: .*; nothing was done"):
        parse_request("r1", {**REQUEST, **change})


def test_a_request_without_an_action_or_with_an_unknown_one_is_refused() -> None:
    with pytest.raises(JobError, match="unknown action None"):
        parse_request("r1", {"created": 1.0})
    with pytest.raises(JobError, match="unknown action 'reboot'"):
        parse_request("r1", {"action": "reboot"})
    with pytest.raises(JobError, match="not a JSON object"):
        parse_request("r1", ["stop"])


# ---------------------------------------------------------------------------- on disk


@pytest.fixture
def job(tmp_path: Path) -> JobDir:
    return JobDir.create("job-1", str(tmp_path / "jobs" / "job 1"))


def test_a_malformed_status_field_is_left_out_with_one_log_line(
    job: JobDir, caplog: pytest.LogCaptureFixture
) -> None:
    write_json_atomic(job.file("status.json"), {"state": "running", "step": "twelve"})
    with caplog.at_level(logging.WARNING, logger="ferry"):
        assert job.status() == {"state": "running"}
        assert job.status() == {"state": "running"}  # polled again: said once
    lines = [r.getMessage() for r in caplog.records if "status.json" in r.getMessage()]
    assert len(lines) == 1 and "step: expected an integer" in lines[0]


def test_the_writer_keeps_fields_it_does_not_know(job: JobDir) -> None:
    write_json_atomic(job.file("status.json"), {"state": "running", "gpu_model": "H100"})
    job.update_status("checkpointing", step=3)
    raw = json.loads(Path(job.file("status.json")).read_text())
    assert raw["gpu_model"] == "H100" and raw["step"] == 3
    assert job.status().get("state") == "checkpointing"


def test_a_job_file_that_is_a_link_a_fifo_or_too_big_is_not_read(job: JobDir, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(IDENTITY))
    os.symlink(elsewhere, job.file("job.json"))
    assert job.identity() == {}
    os.mkfifo(job.file("status.json"))  # reading it would block for ever
    assert job.status() == {}
    os.unlink(job.file("status.json"))
    Path(job.file("status.json")).write_text(json.dumps({"state": "running", "pad": "x" * MAX_DOC_BYTES}))
    assert job.status() == {}


def test_torn_and_foreign_event_lines_are_skipped(job: JobDir) -> None:
    job.event("run_start", supervisor_pid=4000, command=["python", "t.py"])
    with open(job.file("events.jsonl"), "a") as f:
        f.write('{"time": 2.0, "event": "worker_st\n')  # a torn append (a full disk)
        f.write('["not", "an", "event"]\n')
        f.write('{"time": 3.0, "event": "stop", "step": 4}\n')
    assert [e["event"] for e in job.events()] == ["run_start", "stop"]


def test_a_request_created_yesterday_is_refused_with_an_answer_and_a_log_line(
    job: JobDir, caplog: pytest.LogCaptureFixture
) -> None:
    write_json_atomic(os.path.join(job.control, "req-bad.json"), {"action": "stop", "created": "yesterday"})
    good = submit(job, "checkpoint")
    with caplog.at_level(logging.WARNING, logger="ferry"):
        assert [r.id for r in ControlInbox(job).poll()] == [good]
    answer = wait_response(job, "bad", timeout=1)
    assert answer["ok"] is False and "malformed created" in answer.get("error", "")
    assert any("control request bad ignored" in r.getMessage() for r in caplog.records)
    assert not os.path.exists(os.path.join(job.control, "req-bad.json"))


@pytest.mark.parametrize("make", ["symlink", "fifo", "huge"])
def test_a_request_that_is_not_a_small_regular_file_is_refused(
    job: JobDir, tmp_path: Path, make: str
) -> None:
    path = os.path.join(job.control, "req-odd.json")
    if make == "symlink":
        target = tmp_path / "req.json"
        target.write_text(json.dumps({"action": "stop"}))
        os.symlink(target, path)
    elif make == "fifo":
        os.mkfifo(path)
    else:
        Path(path).write_text(json.dumps({"action": "stop", "pad": "x" * (1 << 20)}))
    assert ControlInbox(job).poll() == []
    answer = wait_response(job, "odd", timeout=1)
    assert answer["ok"] is False and answer.get("error", "").startswith("refused")
    assert not os.path.lexists(path)


def test_a_malformed_answer_is_a_job_error(job: JobDir) -> None:
    write_json_atomic(os.path.join(job.control, "resp-r1.json"), {"id": "r1", "ok": "sure"})
    with pytest.raises(JobError, match=r"not a ferry answer .*ok"):
        wait_response(job, "r1", timeout=1)
