"""Integration fixtures: real servers (see servers.py), a checkpoint root on every backend, and
the shared uninterrupted reference run (reference.py)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from reference import reference
from servers import S3Server, XRootDServer, s3_server, xrootd_server

__all__ = ["reference", "s3_server", "xrootd_server"]

BACKENDS = ["local", "memory", "s3", "xrootd"]

HOSTILE_DIR = "ckpt dir with spaces, 'single' and \"double\" quotes; $HOME `id` *"
"""A local folder name that breaks anything that pastes paths into a shell or a glob."""


@pytest.fixture(params=BACKENDS)
def backend_root(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A fresh, empty checkpoint root URL on each backend, reachable by ``ferry.engine``
    with no storage options passed (what a user's training script gets)."""
    name = request.param
    unique = uuid.uuid4().hex[:12]
    if name == "local":
        yield str(tmp_path / HOSTILE_DIR)
    elif name == "memory":
        import fsspec

        yield f"memory://ferry-{unique}/ckpt"
        with contextlib.suppress(FileNotFoundError):
            fsspec.filesystem("memory").rm(f"/ferry-{unique}", recursive=True)
    elif name == "s3":
        import s3fs

        s3: S3Server = request.getfixturevalue("s3_server")
        for key, value in s3.env.items():
            monkeypatch.setenv(key, value)
        # s3fs caches filesystems by their arguments, not the environment: drop any made
        # against another endpoint, and ours once the test's environment is gone.
        s3fs.S3FileSystem.clear_instance_cache()
        yield f"s3://{s3.bucket}/{unique}/ckpt"
        s3fs.S3FileSystem.clear_instance_cache()
    elif name == "xrootd":
        xrd: XRootDServer = request.getfixturevalue("xrootd_server")
        yield f"{xrd.url}/{unique}/ckpt"
    else:
        raise AssertionError(name)
