"""The control channel on a real job directory: a controller submits, the worker polls and
answers; unknown actions and requests from another user are refused, with an answer."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from ferry.errors import JobError
from ferry.runtime.control import ACTIONS, ControlInbox, submit, wait_response
from ferry.runtime.jobdir import JobDir, write_json_atomic

NOBODY = 65534


@pytest.fixture
def job(tmp_path: Path) -> JobDir:
    return JobDir.create("job-1", str(tmp_path / "jobs" / "job 1 'quoted'"))


def mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_job_dir_is_private(job: JobDir) -> None:
    assert mode(job.path) == 0o700
    assert mode(job.control) == 0o700
    assert os.stat(job.path).st_uid == os.getuid()


def test_an_existing_job_dir_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "open"
    path.mkdir(mode=0o755)
    os.chmod(path, 0o755)
    job = JobDir.create("open", str(path))
    assert mode(job.path) == 0o700


def test_the_default_job_dir_lives_under_ferry_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_HOME", str(tmp_path / "home"))
    job = JobDir.create("abc")
    assert job.path == str(tmp_path / "home" / "jobs" / "abc")
    assert mode(job.path) == 0o700


@pytest.mark.parametrize("action", ACTIONS)
def test_submit_poll_respond_round_trip(job: JobDir, action: str) -> None:
    rid = submit(job, action)
    path = os.path.join(job.control, f"req-{rid}.json")
    assert mode(path) == 0o600
    doc = json.loads(Path(path).read_text())
    assert doc["action"] == action and doc["uid"] == os.getuid()

    inbox = ControlInbox(job)
    (request,) = inbox.poll()
    assert (request.id, request.action) == (rid, action)
    assert not os.path.exists(path), "a request is consumed once"
    assert inbox.poll() == []

    inbox.respond(rid, ok=True, step=12, url="file:///ck/step-12")
    answer = wait_response(job, rid, timeout=1)
    assert answer["id"] == rid and answer["ok"] is True
    assert answer["step"] == 12 and answer["url"] == "file:///ck/step-12"


def test_a_restart_request_carries_its_environment(job: JobDir) -> None:
    rid = submit(job, "restart", env={"CUDA_VISIBLE_DEVICES": "1"})
    (request,) = ControlInbox(job).poll()
    assert (request.id, request.action, request.env) == (rid, "restart", {"CUDA_VISIBLE_DEVICES": "1"})


def test_a_request_without_env_has_none_or_empty(job: JobDir) -> None:
    submit(job, "checkpoint")
    write_json_atomic(os.path.join(job.control, "req-old.json"), {"action": "stop", "created": 1.0})
    envs = {r.id: r.env for r in ControlInbox(job).poll()}
    assert envs.pop("old") is None
    assert list(envs.values()) == [{}]


def test_only_the_writing_rank_reads_requests(job: JobDir) -> None:
    """On ranks other than 0 the job directory is read-only: requests stay for rank 0."""
    rid = submit(job, "stop")
    job.writer = False
    assert ControlInbox(job).poll() == []
    job.writer = True
    assert [r.id for r in ControlInbox(job).poll()] == [rid]


def test_requests_come_out_oldest_first(job: JobDir) -> None:
    rids = []
    for action in ("stop", "checkpoint", "checkpoint"):
        rids.append(submit(job, action))
        time.sleep(0.002)
    assert [r.id for r in ControlInbox(job).poll()] == rids


def test_the_controller_waits_for_an_answer_given_later(job: JobDir) -> None:
    rid = submit(job, "checkpoint")
    inbox = ControlInbox(job)

    def worker() -> None:
        time.sleep(0.1)
        for r in inbox.poll():
            inbox.respond(r.id, ok=True, step=3)

    t = threading.Thread(target=worker)
    t.start()
    answer = wait_response(job, rid, timeout=5)
    t.join()
    assert answer == {**answer, "ok": True, "step": 3, "id": rid}


def test_an_unknown_action_is_refused_at_submit(job: JobDir) -> None:
    with pytest.raises(JobError) as info:
        submit(job, "reboot")
    assert f"unknown control action 'reboot'; use one of {', '.join(ACTIONS)}" in str(info.value)
    assert os.listdir(job.control) == []


def test_an_unknown_action_dropped_by_hand_is_refused_with_an_answer(job: JobDir) -> None:
    write_json_atomic(os.path.join(job.control, "req-hand.json"), {"action": "rm -rf /", "created": 1.0})
    assert ControlInbox(job).poll() == []
    answer = wait_response(job, "hand", timeout=1)
    assert answer["ok"] is False and "unknown action 'rm -rf /'" in answer["error"]
    assert not os.path.exists(os.path.join(job.control, "req-hand.json"))


def test_other_files_in_the_control_folder_are_left_alone(job: JobDir) -> None:
    for name in ("resp-old.json", "req-x.json.tmp-1-2", "notes.txt"):
        Path(job.control, name).write_text("{}")
    assert ControlInbox(job).poll() == []
    assert sorted(os.listdir(job.control)) == ["notes.txt", "req-x.json.tmp-1-2", "resp-old.json"]


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file to another user")
def test_a_request_owned_by_another_user_is_refused_with_an_answer(job: JobDir) -> None:
    rid = submit(job, "stop")
    path = os.path.join(job.control, f"req-{rid}.json")
    os.chown(path, NOBODY, NOBODY)
    inbox = ControlInbox(job)
    assert inbox.poll() == []
    answer = wait_response(job, rid, timeout=1)
    assert answer["ok"] is False
    assert f"refused: request owned by uid {NOBODY}, the job runs as uid 0" in answer["error"]
    assert not os.path.exists(path)
    # an honest request beside it still goes through
    good = submit(job, "checkpoint")
    assert [r.id for r in inbox.poll()] == [good]


def test_the_controller_times_out_with_advice(job: JobDir) -> None:
    rid = submit(job, "checkpoint")
    with pytest.raises(JobError, match="retry with a longer --timeout"):
        wait_response(job, rid, timeout=0.1)


def test_the_controller_stops_waiting_when_the_worker_is_gone(job: JobDir) -> None:
    rid = submit(job, "checkpoint")
    with pytest.raises(JobError, match="worker exited before answering"):
        wait_response(job, rid, timeout=5, alive=lambda: False)


def test_a_gone_control_folder_polls_empty(tmp_path: Path) -> None:
    job = JobDir(str(tmp_path / "never-created"))
    assert ControlInbox(job).poll() == []
    ControlInbox(job).respond("x", ok=False)  # the answer is dropped, nothing raises


def test_a_garbled_request_is_answered(job: JobDir) -> None:
    Path(job.control, "req-bad.json").write_text("{not json")
    assert ControlInbox(job).poll() == []
    answer = wait_response(job, "bad", timeout=0.3)
    assert answer["ok"] is False
