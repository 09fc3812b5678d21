"""Progress of a long copy: ``ferry resume`` copying a checkpoint draws a live line (bytes,
percentage, throughput) on a terminal, and nothing of it into a pipe or with ``--json``;
the one-line summary with size, time and throughput is printed either way (not with --json)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ferry.engine import save

from trainrun import env_for

pytestmark = pytest.mark.integration
FERRY = [sys.executable, "-c", "from ferry.cli import main; main()"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint root holding one 8 MiB checkpoint."""
    path = tmp_path_factory.mktemp("progress") / "ck"
    save({"w": torch.zeros(2 << 20)}, str(path), step=3)
    return path


def resume(root: Path, tmp_path: Path, *options: str, terminal: bool) -> str:
    """``ferry resume ROOT -- true``, stderr (and stdout) a pseudo-terminal or a pipe; all it wrote."""
    new = str(tmp_path / "new")
    argv = [*FERRY, "resume", str(root), "--job-id", "p", "--dir", new, *options, "--", "true"]
    env = env_for(tmp_path / "home")
    if not terminal:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout + done.stderr
    master, slave = os.openpty()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the command and its worker closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(120) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


def test_a_copy_draws_its_progress_on_a_terminal(root: Path, tmp_path: Path) -> None:
    out = resume(root, tmp_path, terminal=True)
    assert "\rferry: copying step-000000000003: 0.0 MiB of 8.0 MiB, 0%" in out, out
    assert "8.0 MiB of 8.0 MiB, 100%" in out and "MiB/s" in out
    assert "copied step-000000000003 (8.0 MiB in " in out  # the summary


def test_a_copy_is_quiet_in_a_pipe_and_with_json(root: Path, tmp_path: Path) -> None:
    piped = resume(root, tmp_path / "piped", terminal=False)
    assert "\r" not in piped and " of 8.0 MiB" not in piped, piped
    assert "copied step-000000000003 (8.0 MiB in " in piped and "MiB/s) to " in piped
    as_json = resume(root, tmp_path / "json", "--json", terminal=True)
    assert " of 8.0 MiB" not in as_json and "copied step-" not in as_json, as_json
