"""Files ferry reads and locks in folders the job or another process could write: a symlink
planted there is never followed, a FIFO never hangs the reader, an oversized, deeply nested
or ill-typed document is refused with a one-line reason, and nothing of it crashes the
supervisor. Real files in a temporary folder; no mocks."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest

from ferry.cli.events import EventFollower
from ferry.errors import ConfigError, JobError, ProcessCheckpointError
from ferry.process.criu import MANIFEST, restore
from ferry.process.pids import start_time
from ferry.process.record import SuspendRecord, load_record, save_record
from ferry.runtime.control import ControlInbox
from ferry.runtime.finished import FINISHED, read_finished
from ferry.runtime.jobdir import JobDir
from ferry.runtime.rootlock import RootLock, nodes
from ferry.schedulers import detect as detect_scheduler
from ferry.schedulers.slurm import SlurmAdapter, claim_name
from ferry.supervisor import warm

# ---------------------------------------------------------------------- SLURM requeue


def slurm(tmp_path: Path, restart: int = 0) -> tuple[SlurmAdapter, Path, Path]:
    """A SLURM adapter whose ``scontrol`` appends its arguments to a file; its job folder."""
    bin_dir, job = tmp_path / "bin", tmp_path / "job"
    bin_dir.mkdir()
    job.mkdir(mode=0o700)
    calls = tmp_path / "scontrol.calls"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    scontrol.chmod(0o755)
    env = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": str(restart), "PATH": str(bin_dir)}
    return SlurmAdapter(env=env), job, calls


def test_a_symlink_at_the_requeue_lock_is_not_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    adapter, job, calls = slurm(tmp_path)
    victim = tmp_path / "elsewhere" / "victim"
    victim.parent.mkdir()
    (job / "slurm-requeue.lock").symlink_to(victim)
    with caplog.at_level(logging.INFO, logger="ferry.run"):
        assert adapter.after_checkpoint(step=5, code=85, state_dir=str(job)) == 85
    assert not victim.exists()  # the link was not followed: nothing created through it
    assert not calls.exists() and not (job / claim_name("7", 0)).exists()
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "slurm-requeue.lock is a symbolic link, which ferry does not follow; remove it" in line
    assert "\n" not in line and "(step 5)" in line
    os.unlink(job / "slurm-requeue.lock")  # the fix the error names works
    assert adapter.after_checkpoint(step=5, code=85, state_dir=str(job)) == 85
    assert calls.read_text() == "requeue 7\n"


def test_a_claim_that_is_a_link_a_fifo_garbled_or_oversized_counts_as_none(tmp_path: Path) -> None:
    adapter, job, calls = slurm(tmp_path, restart=1)
    # This run's claim, a symlink to a claim that would say "already requeued" if followed.
    target = tmp_path / "planted.json"
    target.write_text(json.dumps({"job": "7", "cluster": None, "restart": 1, "step": 4, "time": time.time()}))
    (job / claim_name("7", 1)).symlink_to(target)
    # The restart before's claim, a FIFO: opening it for reading without a writer blocks.
    os.mkfifo(job / claim_name("7", 0))
    assert adapter.after_checkpoint(step=5, code=85, state_dir=str(job)) == 85
    assert calls.read_text() == "requeue 7\n"
    assert target.read_text().startswith('{"job": "7"')  # untouched: the new claim replaced the link
    claim = job / claim_name("7", 1)
    assert not claim.is_symlink() and json.loads(claim.read_text())["step"] == 5
    # Ill-typed, oversized and deeply nested previous claims are no claim either (no "no progress").
    for bad in ('{"job": "7", "cluster": null, "restart": 0, "step": "5", "time": 1}',
                " " * 5000 + "{}", "[" * 100_000):  # fmt: skip
        os.unlink(claim)
        (job / claim_name("7", 0)).unlink()
        (job / claim_name("7", 0)).write_text(bad)
        assert adapter.after_checkpoint(step=5, code=85, state_dir=str(job)) == 85
    assert calls.read_text() == "requeue 7\n" * 4


# ---------------------------------------------------------------------- warm requests


def request(**fields: object) -> bytes:
    doc = {"id": "x", "created": 1.0, "uid": os.getuid(), "env": {"CUDA_VISIBLE_DEVICES": "1"}, "expires": 60}
    return json.dumps({**doc, **fields}).encode()


CRAFTED = {
    "wrong-type-env": request(env={"A": 1}),
    "wrong-type-expiry": request(expires="60"),
    "env-a-list": request(env=[["A", "1"]]),
    "huge-expiry": request(expires=1e299),
    "huge-uid": b'{"id": "x", "created": 1, "uid": 99999999999999999999999, "env": {}, "expires": 5}',
    "nul-in-env": request(env={"A": "x\u0000y"}),
    "equals-in-name": request(env={"A=B": "1"}),
    "empty-name": request(env={"": "1"}),
    "deep": b"[" * 60_000,
    "deep-env": b'{"env": ' + b'{"a": ' * 5_000 + b"1" + b"}" * 5_001,
    "huge": b"{}",  # made 10 MB (sparse) below
}


def test_crafted_warm_requests_are_refused_logged_and_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = JobDir.create("j", str(tmp_path / "j"))
    control = Path(job.control)
    for name, raw in CRAFTED.items():
        (control / f"warm-{name}.json").write_bytes(raw)
    os.truncate(control / "warm-huge.json", 10 << 20)
    (tmp_path / "good.json").write_bytes(request())
    (control / "warm-link.json").symlink_to(tmp_path / "good.json")  # a good request, through a link
    os.mkfifo(control / "warm-fifo.json")  # no writer: a blocking read would hang the supervisor
    (control / "warm-folder.json").mkdir()
    (control / "warm-extra.json").write_bytes(request(command=["rm", "-rf", "/"], env={"B": "2"}))
    with caplog.at_level(logging.WARNING, logger="ferry.run"):
        taken = warm.take_requests(job)  # the FIFO is not opened: no hang
    refused = {r[0]: r[1] for r in taken if isinstance(r, tuple)}
    assert set(refused) == {*CRAFTED, "link", "fifo", "folder"}, refused
    assert all(why.startswith("warm start refused: ") and "\n" not in why for why in refused.values())
    assert "not a regular file" in refused["fifo"] and "10485760 bytes" in refused["huge"]
    assert "nested deeper" in refused["deep"] and "nested deeper" in refused["deep-env"]
    assert "which no process environment can hold" in refused["nul-in-env"]
    logged = [r.getMessage() for r in caplog.records]
    assert all(any(f"warm request {rid} refused: " in m for m in logged) for rid in refused)
    # An undeclared key is dropped, never obeyed: the request is the schema's fields only.
    good = [r for r in taken if isinstance(r, warm.WarmRequest)]
    assert good == [warm.WarmRequest("extra", {"B": "2"}, 60.0)]
    # Each is answered once: all are gone (the folder set aside), none comes back at the next wake-up.
    assert warm.take_requests(job) == [] and not list(control.glob("warm-*"))
    assert (tmp_path / "good.json").exists()


# ---------------------------------------------------------------------- the audit's other readers

DEEP = b"[" * 50_000  # under every size limit, past Python's recursion limit


def test_job_files_nested_too_deep_are_refused_not_raised(tmp_path: Path) -> None:
    job = JobDir.create("j", str(tmp_path / "j"))
    for name in ("job.json", "status.json"):
        Path(job.file(name)).write_bytes(DEEP)
    good = json.dumps({"time": 1.0, "event": "run_start", "supervisor_pid": 7}).encode()
    Path(job.file("events.jsonl")).write_bytes(b"[" * 5_000 + b"\n" + good + b"\n")
    Path(job.control, "req-deep.json").write_bytes(DEEP)
    assert job.identity() == {} and job.status() == {}
    assert [e["event"] for e in job.events()] == ["run_start"]
    assert ControlInbox(job).poll() == []  # refused, answered, removed: never raised into the loop
    answer = json.loads(Path(job.control, "resp-deep.json").read_text())
    assert answer["ok"] is False and "nested deeper" in answer["error"]
    assert not Path(job.control, "req-deep.json").exists()


def test_the_checkpoint_roots_locks_are_regular_files_never_links(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    victim = tmp_path / "victim"
    lock = root / ".ferry-lock"
    lock.symlink_to(victim)
    with pytest.raises(JobError, match=r"\.ferry-lock is a symbolic link: .*; remove it, then start"):
        RootLock.acquire(str(root), "j")
    assert not victim.exists()
    lock.unlink()
    os.mkfifo(lock)
    with pytest.raises(JobError, match=r"\.ferry-lock is not a regular file: .*remove it"):
        RootLock.share(str(root), "j", "node0", {}, exact=True)
    lock.unlink()
    lock.mkdir()
    with pytest.raises(JobError, match=r"\.ferry-lock is a folder: .*remove it"):
        RootLock.acquire(str(root), "j")
    lock.rmdir()
    # The nodes' records: a FIFO and a deeply nested one are no node's; a real one is listed.
    os.mkfifo(root / ".ferry-node-a")
    (root / ".ferry-node-b").write_bytes(DEEP[:4000])
    held = RootLock.share(str(root), "j", "c", {"host": "h"}, exact=True)
    assert held is not None
    try:
        assert [n["node"] for n in nodes(str(root))] == ["c"]
    finally:
        held.release()


def test_a_suspend_record_that_is_not_one_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_HOME", str(tmp_path))
    pid = os.getpid()
    record = SuspendRecord(pid, start_time(pid), None, warnings=["w"])
    path = Path(save_record(record))
    assert load_record(pid) == record
    uuid = "GPU-" + "0" * 8 + "-0000-0000-0000-" + "0" * 12
    for bad in ([], {"pid": "7"}, {"pid": pid, "opened": ["MIG-1"]}, {"pid": pid, "gpus": [{"uuid": uuid}]},
                {"pid": pid, "warnings": "w"}):  # fmt: skip
        path.write_text(json.dumps(bad))
        assert load_record(pid) is None, bad
    path.write_bytes(DEEP)
    assert load_record(pid) is None


def test_ferry_run_json_follows_only_its_regular_events_file(tmp_path: Path) -> None:
    path, out = tmp_path / "events.jsonl", tmp_path / "out"
    with open(out, "wb") as sink:
        follower = EventFollower(str(path), sink.fileno())
        os.mkfifo(path)
        follower.drain()  # a FIFO is not opened for reading: no hang
        path.unlink()
        elsewhere = tmp_path / "elsewhere.jsonl"
        elsewhere.write_text(json.dumps({"time": 1.0, "event": "run_start"}) + "\n")
        path.symlink_to(elsewhere)
        follower.drain()  # not followed
        path.unlink()
        good = json.dumps({"time": 2.0, "event": "run_end", "exit_code": 0})
        path.write_bytes(b"[" * 5_000 + b"\n" + good.encode() + b"\n")
        follower.drain()  # the deep line is skipped, the next one copied
    assert [json.loads(line)["event"] for line in out.read_text().splitlines()] == ["run_end"]


def test_a_finished_record_nested_too_deep_is_none(tmp_path: Path) -> None:
    (tmp_path / FINISHED).write_bytes(DEEP)
    assert read_finished(str(tmp_path)) is None  # the job then runs as if it had none


def test_the_htcondor_job_ad_is_read_only_from_a_small_regular_file(tmp_path: Path) -> None:
    fifo, huge = tmp_path / "fifo.ad", tmp_path / "huge.ad"
    os.mkfifo(fifo)  # no writer: a blocking read would hang `ferry run` at its start
    with pytest.raises(ConfigError, match=r"is not a regular file: .*unset _CONDOR_JOB_AD outside HTCondor"):
        detect_scheduler({"_CONDOR_JOB_AD": str(fifo)})
    huge.write_text("ClusterId = 1\n")
    os.truncate(huge, 2 << 20)
    with pytest.raises(ConfigError, match="holds more than 1048576 bytes"):
        detect_scheduler({"_CONDOR_JOB_AD": str(huge)})


def test_a_criu_manifest_that_is_not_an_object_is_no_crash(tmp_path: Path) -> None:
    (tmp_path / "inventory.img").write_bytes(b"")
    (tmp_path / MANIFEST).write_text("[1, 2]")
    with pytest.raises(ProcessCheckpointError):  # on to CRIU's own checks (root, criu on PATH)
        restore(str(tmp_path))
