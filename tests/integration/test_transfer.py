"""Transfer policies against real servers: moto's S3 server and an XRootD daemon on
loopback (servers.py), and a shared-filesystem path. A job checkpoints locally, the copies
go to the remote in the background, a "new node" with an empty local folder fetches and
resumes bitwise. The fault: the remote server is killed mid-transfer."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ferry.chaos.remote import start_moto
from ferry.engine import list_checkpoints, load, save
from ferry.engine.transfer import Transfer, TransferError, TransferPolicy, copy_checkpoint
from ferry.runtime.procs import stop_process
from ferry.storage import Storage, open_storage

from servers import S3Server, XRootDServer, _wait_for_line
from trainrun import assert_same, env_for, run

pytestmark = pytest.mark.integration


# XRootD runs the same path (push, then fetch on a fresh node) in the fault test below; the
# whole-job run here costs two training processes, so it runs on S3 only by default.
@pytest.fixture(params=["s3"])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """(remote root URL, environment that reaches it); ``xrootd`` is a valid param too."""
    unique = tmp_path.name[-20:].replace("[", "-").replace("]", "")
    if request.param == "s3":
        import s3fs

        s3: S3Server = request.getfixturevalue("s3_server")
        s3fs.S3FileSystem.clear_instance_cache()
        yield f"s3://{s3.bucket}/transfer-{unique}/ckpt", s3.env
        s3fs.S3FileSystem.clear_instance_cache()
    else:
        xrd: XRootDServer = request.getfixturevalue("xrootd_server")
        yield f"{xrd.url}/transfer-{unique}/ckpt", {}


def test_background_copy_then_a_new_node_fetches_and_resumes_bitwise(
    remote: tuple[str, dict[str, str]], tmp_path: Path, reference: Path
) -> None:
    url, server_env = remote
    out = tmp_path / "run"
    first = run(
        "train_explicit.py",
        out,
        ["--signal-at", "15"],
        env_for(
            tmp_path / "home",
            FERRY_DIR=str(tmp_path / "node1"),
            FERRY_REMOTE=url,
            FERRY_EVERY_STEPS="10",
            **server_env,
        ),
    )
    assert first.returncode == 85, first.stderr
    assert "copied to" in first.stderr, first.stderr
    with _env(server_env):
        local = [r.name for r in list_checkpoints(open_storage(str(tmp_path / "node1")))]
        remote_refs = [r.name for r in list_checkpoints(open_storage(url))]
    assert remote_refs == local, "every committed local checkpoint is on the remote too"
    # Another node: nothing local; the restore fetches from the remote.
    second = run(
        "train_explicit.py",
        out,
        [],
        env_for(tmp_path / "home2", FERRY_DIR=str(tmp_path / "node2"), FERRY_REMOTE=url, **server_env),
    )
    assert second.returncode == 0, second.stderr
    assert "no local checkpoint; fetched" in second.stderr and "ferry: resumed from" in second.stderr
    assert_same(reference, out)


class _env:
    def __init__(self, env: dict[str, str]) -> None:
        self.env, self.saved = env, {k: os.environ.get(k) for k in env}

    def __enter__(self) -> None:
        os.environ.update(self.env)

    def __exit__(self, *exc: object) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _state(mb: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(mb)
    return {"w": torch.randn(mb * 262144, generator=g), "b": torch.arange(10)}


def test_shared_fs_callback_both_ways_and_sync_mode(tmp_path: Path) -> None:
    """A user callback replaces the copy in both directions; ``sync`` returns only when the
    remote has the checkpoint; a shared filesystem path is a remote like any other."""
    local, shared = str(tmp_path / "local"), str(tmp_path / "shared")
    info = save(_state(), local, step=7)
    name = info.url.rsplit("/", 1)[-1]
    calls: list[tuple[str, str, str]] = []

    def callback(direction: str, src: str, dst: str) -> None:
        calls.append((direction, src, dst))
        policy = TransferPolicy(remote=dst)
        if direction == "push":
            copy_checkpoint(open_storage(local), name, open_storage(dst), policy)
        else:
            copy_checkpoint(open_storage(src), name, open_storage(dst), policy)

    pushed = Transfer(local, TransferPolicy(remote=shared, mode="sync", callback=callback)).push(name)
    assert pushed.done() and pushed.result() == open_storage(shared).child_url(name)
    assert calls == [("push", open_storage(local).child_url(name), open_storage(shared).url)]
    node2 = str(tmp_path / "node2")
    fetched = Transfer(node2, TransferPolicy(remote=shared, callback=callback)).fetch_if_missing()
    assert calls[-1] == ("fetch", open_storage(shared).url, open_storage(node2).url)
    assert fetched is not None and torch.equal(load(fetched).state["w"], _state()["w"])
    # The built-in copy, the same way: a local copy present means no fetch.
    assert Transfer(node2, TransferPolicy(remote=shared)).fetch_if_missing() is None


# ------------------------------------------------------------------ faults


def _moto(port: int = 0) -> tuple[subprocess.Popen[bytes], str]:
    return start_moto(tempfile.mkdtemp(prefix="ferry-moto-fault-"), port)


# s3fs's file object, aborted while the server is down, retries its flush at garbage
# collection and fails again there: expected here, and not ferry's.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_s3_server_killed_mid_transfer(tmp_path: Path) -> None:
    pytest.importorskip("moto")
    s3fs = pytest.importorskip("s3fs")
    boto3 = pytest.importorskip("boto3")
    proc, endpoint = _moto()
    options: dict[str, object] = {"endpoint_url": endpoint, "key": "k", "secret": "s"}
    # ferry's retries are under test: no retries underneath them, and refused connections fail fast.
    options.update(config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 2})
    try:
        s3fs.S3FileSystem(**options).mkdir("fault")
        s3fs.S3FileSystem.clear_instance_cache()
        local = str(tmp_path / "local")
        info = save(_state(64), local, step=3)  # 64 MiB: two multipart parts; the upload takes a while
        name = info.url.rsplit("/", 1)[-1]
        policy = TransferPolicy(
            remote="s3://fault/ck", retries=3, backoff_seconds=0.2, storage_options=options
        )
        transfer = Transfer(local, policy)
        handle = transfer.push(name)
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s")
        deadline = time.monotonic() + 60
        while not client.list_multipart_uploads(Bucket="fault").get("Uploads"):
            assert time.monotonic() < deadline and not handle.done(), "no upload began"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)  # mid-transfer
        proc.wait()
        started = time.monotonic()
        with pytest.raises(TransferError) as failed:
            handle.result(timeout=120)
        assert "failed 4 times" in str(failed.value), failed.value
        assert time.monotonic() - started >= 0.2 + 0.4 + 0.8 - 0.1  # the backoff was waited out
        outcome: list[tuple[object, object]] = []  # what the session records in the job's events
        handle.on_done(lambda error, url: outcome.append((type(error), url)))
        assert outcome == [(TransferError, None)] and len(handle.failed) == 3, handle.failed
        # A new node (nothing local) while the remote is down: the listing fails loudly after
        # its retries, never reads as "no checkpoint there" (which would train from step 0).
        with pytest.raises(TransferError, match="listing s3://fault/ck failed 4 times"):
            Transfer(str(tmp_path / "new-node"), policy).fetch_if_missing()
        # The local checkpoint is kept, committed and loadable.
        assert [r.name for r in list_checkpoints(open_storage(local))] == [name]
        assert torch.equal(load(local).state["w"], _state(64)["w"])
        # The server back (empty, as moto restarts): the next push copies it whole, and the
        # remote lists nothing but committed, complete checkpoints.
        port = int(endpoint.rsplit(":", 1)[1])
        proc, endpoint = _moto(port)
        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem(**options).mkdir("fault")
        assert transfer.push(name).result(timeout=120).endswith(name)
        remote = open_storage("s3://fault/ck", **options)
        assert [r.name for r in list_checkpoints(remote)] == [name]
        assert torch.equal(load_from(remote, name), _state(64)["w"])
    finally:
        stop_process(proc)
        s3fs.S3FileSystem.clear_instance_cache()


def load_from(storage: Storage, name: str) -> torch.Tensor:
    """Fetch a remote checkpoint to a fresh local folder with the built-in copy, then load."""
    local = tempfile.mkdtemp(prefix="ferry-fetch-")
    copy_checkpoint(storage, name, open_storage(local), TransferPolicy(remote=storage.url))
    w = load(local).state["w"]
    assert isinstance(w, torch.Tensor)
    return w


def test_xrootd_server_killed_mid_transfer_never_commits_a_partial_checkpoint(
    tmp_path: Path, xrootd_server: XRootDServer
) -> None:
    """A dedicated daemon on its own export folder, SIGKILLed while a copy writes into it,
    restarted on the same folder: the partial copy is there, but not committed."""
    from servers import XROOTD_CONFIG, _chown_tree, _xrootd_user

    user = _xrootd_user()
    work = Path(tempfile.mkdtemp(prefix="ferry-xrootd-fault-"))
    export, admin = work / "export", work / "admin"
    export.mkdir()
    admin.mkdir()
    (work / "xrootd.cfg").write_text(XROOTD_CONFIG.format(export=export, admin=admin))
    if user is not None:
        work.chmod(0o755)
        _chown_tree(work, *user)

    def start(n: int) -> tuple[subprocess.Popen[bytes], str]:
        log = work / f"xrootd-{n}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["xrootd", "-c", str(work / "xrootd.cfg"), "-s", str(admin / "xrootd.pid")],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=work,
                user=user[0] if user else None,
                group=user[1] if user else None,
                extra_groups=[] if user else None,
            )
        m = _wait_for_line(proc, log, r":(\d+) initialization (completed|failed)", "xrootd")
        assert m[2] == "completed"
        return proc, f"root://127.0.0.1:{m[1]}/"

    proc, url = start(1)
    try:
        local = str(tmp_path / "local")
        info = save(_state(64), local, step=3)
        name = info.url.rsplit("/", 1)[-1]
        transfer = Transfer(
            local, TransferPolicy(remote=f"{url}/{export}/ck", retries=2, backoff_seconds=0.2)
        )
        handle = transfer.push(name)
        deadline = time.monotonic() + 30
        while not any(p.is_file() and p.stat().st_size > 0 for p in export.rglob("*")):
            assert time.monotonic() < deadline and not handle.done(), "no copy began"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        with pytest.raises(TransferError, match="failed 3 times"):
            handle.result(timeout=120)
        assert [r.name for r in list_checkpoints(open_storage(local))] == [name]
        proc, url = start(2)  # the same export folder, behind a new port
        remote = open_storage(f"{url}/{export}/ck")
        assert list_checkpoints(remote) == [], "a partial copy shows as committed"
        assert any(p.is_file() for p in export.rglob("*")), "nothing partial was left to test"
        fixed = Transfer(local, TransferPolicy(remote=f"{url}/{export}/ck"))
        fixed.push(name).result(timeout=120)
        assert [r.name for r in list_checkpoints(remote)] == [name]
        node2 = Transfer(str(tmp_path / "node2"), TransferPolicy(remote=f"{url}/{export}/ck"))
        fetched = node2.fetch_if_missing()
        assert fetched is not None and torch.equal(load(fetched).state["w"], _state(64)["w"])
    finally:
        stop_process(proc)
