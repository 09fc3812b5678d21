"""Real storage servers on loopback, started once per test session and stopped after it.

- ``s3_server``: moto's S3 server in its own process (``python -m moto.server``), so that
  moto's in-process mocks, which other tests may use, never share or reset its state.
- ``xrootd_server``: Debian's ``xrootd`` daemon exporting a temporary folder, run as the
  ``xrootd`` user when the tests run as root, reached through fsspec-xrootd.

Both servers pick their own free port (port 0 / ``xrd.port any``) and report it in their
log, which is read back: no window in which another process can take the port.
A fixture skips its tests, saying what to install, when a server or its client is missing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ferry.chaos.remote import start_moto
from ferry.runtime.procs import stop_process

START_TIMEOUT = 30.0


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    bucket: str
    key: str = "ferry-test-key"
    secret: str = "ferry-test-secret"
    region: str = "us-east-1"

    @property
    def env(self) -> dict[str, str]:
        """Environment that points s3fs/botocore at this server; ferry needs no options then."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    @property
    def storage_options(self) -> dict[str, str]:
        """The same, as fsspec options for ``open_storage(url, **options)``."""
        return {"endpoint_url": self.endpoint_url, "key": self.key, "secret": self.secret}


@dataclass(frozen=True)
class XRootDServer:
    url: str
    """``root://127.0.0.1:PORT/``; append an absolute path (``//tmp/x`` style)."""
    export: Path
    """The folder the server exports, as seen on this machine."""


def _wait_for_line(proc: subprocess.Popen[bytes], log: Path, pattern: str, what: str) -> re.Match[str]:
    """Wait until ``pattern`` appears in ``log``; fail with the log's tail if the server dies."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if m := re.search(pattern, text):
            return m
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    stop_process(proc)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
    raise RuntimeError(f"{what} did not start (exit code {proc.returncode}); its log ends:\n{tail}")


# ------------------------------------------------------------------------------------ S3


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("s3fs") is None:
        pytest.skip("S3 tests need moto[server] and s3fs: pip install -e '.[test]'")
    workdir = Path(tempfile.mkdtemp(prefix="ferry-moto-"))
    proc, url = start_moto(str(workdir))
    try:
        server = S3Server(endpoint_url=url, bucket="ferry-test")
        import s3fs

        s3fs.S3FileSystem(**server.storage_options).mkdir(server.bucket)
        s3fs.S3FileSystem.clear_instance_cache()
        yield server
    finally:
        stop_process(proc)
        shutil.rmtree(workdir, ignore_errors=True)


# -------------------------------------------------------------------------------- XRootD

XROOTD_USER = "xrootd"

XROOTD_CONFIG = """\
# Written by ferry's test fixture. No authentication: clients are limited to loopback.
xrd.port any
xrd.allow host 127.0.0.1
xrd.network nodnr
all.export /
oss.localroot {export}
all.adminpath {admin}
all.pidpath {admin}
"""


def _xrootd_user() -> tuple[int, int] | None:
    """(uid, gid) to run the server as: ``xrootd`` when we are root (created if the package
    did not), else None (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(XROOTD_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", XROOTD_USER],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(XROOTD_USER)
    return entry.pw_uid, entry.pw_gid


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, uid, gid)
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid)


@pytest.fixture(scope="session")
def xrootd_server() -> Iterator[XRootDServer]:
    binary = shutil.which("xrootd")
    if binary is None:
        pytest.skip(
            "no xrootd server binary: run scripts/install-system-deps.sh as root "
            "(Debian package xrootd-server)"
        )
    if importlib.util.find_spec("fsspec_xrootd") is None or importlib.util.find_spec("XRootD") is None:
        pytest.skip("no XRootD Python client: pip install -e '.[xrootd]' (fsspec-xrootd, xrootd)")
    user = _xrootd_user()
    workdir = Path(tempfile.mkdtemp(prefix="ferry-xrootd-"))
    export, admin, log = workdir / "export", workdir / "admin", workdir / "xrootd.log"
    export.mkdir()
    admin.mkdir()
    config = workdir / "xrootd.cfg"
    config.write_text(XROOTD_CONFIG.format(export=export, admin=admin))
    if user is not None:
        workdir.chmod(0o755)
        _chown_tree(workdir, *user)
    # A client that cannot reach the server gives up in seconds instead of minutes. XrdCl
    # reads these once, when the library starts, so they are set before its first use.
    client_env = {"XRD_CONNECTIONWINDOW": "5", "XRD_CONNECTIONRETRY": "2", "XRD_REQUESTTIMEOUT": "60"}
    saved = {k: os.environ.get(k) for k in client_env}
    os.environ.update(client_env)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            # -s: the daemon writes "<pid file dir>/xrootd.anon.env", in /tmp without it.
            [binary, "-c", str(config), "-s", str(admin / "xrootd.pid")],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            user=user[0] if user else None,
            group=user[1] if user else None,
            extra_groups=[] if user else None,
        )
    try:
        m = _wait_for_line(proc, log, r":(\d+) initialization (completed|failed)", "xrootd")
        if m[2] != "completed":
            stop_process(proc)
            raise RuntimeError(f"xrootd failed to start; see {log}:\n{log.read_text()[-3000:]}")
        yield XRootDServer(url=f"root://127.0.0.1:{m[1]}/", export=export)
    finally:
        stop_process(proc)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)
