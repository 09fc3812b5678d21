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
from ferry.runtime.atomicjson import write_json_atomic
from ferry.runtime.control import ACTIONS, MAX_REQUEST_BYTES, ControlInbox, submit, wait_response
from ferry.runtime.jobdir import JobDir

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


# ------------------------------------------------------------------ folders that are not the user's own
def test_a_symlinked_job_dir_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "j").symlink_to(elsewhere)
    with pytest.raises(JobError, match="is a symbolic link: ferry does not use it"):
        JobDir.create("j", str(tmp_path / "jobs" / "j"))
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("where", ["home", "jobs", "job"])
def test_a_symlink_anywhere_under_ferry_home_is_refused(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("FERRY_HOME", str(home))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    target = {"home": home, "jobs": home / "jobs", "job": home / "jobs" / "j"}[where]
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    target.symlink_to(elsewhere)
    with pytest.raises(JobError, match="is a symbolic link"):
        JobDir.create("j")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("bits", [0o020, 0o002, 0o777])
def test_a_job_dir_others_may_write_is_refused(bits: int, tmp_path: Path) -> None:
    path = tmp_path / "open"
    path.mkdir()
    os.chmod(path, 0o700 | bits)
    with pytest.raises(JobError, match="writable by other users"):
        JobDir.create("open", str(path))


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a folder to another user")
@pytest.mark.parametrize("where", ["home", "jobs", "job", "control"])
def test_a_folder_of_another_user_is_refused(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user pre-created the folder (in a shared /tmp, say): the job does not move in."""
    home = tmp_path / "home"
    monkeypatch.setenv("FERRY_HOME", str(home))
    target = {
        "home": home,
        "jobs": home / "jobs",
        "job": home / "jobs" / "j",
        "control": home / "jobs" / "j" / "control",
    }
    for path in list(target.values())[: list(target).index(where)]:
        path.mkdir(mode=0o700)
    target[where].mkdir(mode=0o700)
    os.chown(target[where], NOBODY, NOBODY)
    with pytest.raises(JobError, match=f"is owned by uid {NOBODY}, not by this user"):
        JobDir.create("j")


# ------------------------------------------------------------------ request files of every kind
def _plant(job: JobDir, kind: str, tmp_path: Path) -> str:
    path = os.path.join(job.control, f"req-{kind}.json")
    if kind == "symlink":
        target = tmp_path / "target.json"
        target.write_text(json.dumps({"id": kind, "action": "stop", "created": time.time()}))
        os.symlink(target, path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "oversized":
        Path(path).write_text(
            json.dumps({"id": kind, "action": "stop", "pad": "x" * (MAX_REQUEST_BYTES + 1)})
        )
    elif kind == "malformed-created":
        Path(path).write_text(json.dumps({"id": kind, "action": "stop", "created": "yesterday"}))
    elif kind == "malformed-env":
        Path(path).write_text(json.dumps({"id": kind, "action": "restart", "created": 1.0, "env": {"A": 1}}))
    elif kind == "not-an-object":
        Path(path).write_text("[1, 2]")
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "full-directory":
        os.makedirs(os.path.join(path, "inside"))
        Path(path, "inside", "req-x.json").write_text("{}")
    elif kind == "unreadable":
        Path(path).write_text(json.dumps({"id": kind, "action": "stop", "created": 1.0}))
        os.chmod(path, 0)
    elif kind == "other-owner":
        Path(path).write_text(json.dumps({"id": kind, "action": "stop", "created": 1.0}))
        os.chown(path, NOBODY, NOBODY)
    return kind


KINDS = ["symlink", "fifo", "oversized", "malformed-created", "malformed-env", "not-an-object", "directory",
         "full-directory"] + (["other-owner"] if os.getuid() == 0 else ["unreadable"])  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_a_request_that_is_not_a_small_regular_json_file_is_refused_and_answered(
    kind: str, job: JobDir, tmp_path: Path
) -> None:
    rid = _plant(job, kind, tmp_path)
    done = threading.Event()
    polled: list[object] = []
    threading.Thread(
        target=lambda: (polled.extend(ControlInbox(job).poll()), done.set()), daemon=True
    ).start()
    assert done.wait(5), "polling hung on the request"  # a FIFO must not block the worker
    assert polled == []
    answer = wait_response(job, rid, timeout=1)
    assert answer["ok"] is False and "refused" in answer["error"], answer
    if kind == "symlink":
        assert (tmp_path / "target.json").exists()  # the link's target is left alone
    # answered once: the entry is gone from the requests' names, and the next poll is quiet
    assert not [n for n in os.listdir(job.control) if n.startswith("req-")]
    os.unlink(os.path.join(job.control, f"resp-{rid}.json"))
    assert ControlInbox(job).poll() == []
    left = os.listdir(job.control)
    assert all(n.startswith("refused-") for n in left), left  # no second answer
    assert bool(left) == kind.endswith("directory")  # a folder is set aside, the rest removed
