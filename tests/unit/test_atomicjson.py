"""The one atomic JSON writer (runtime/atomicjson.py): links planted at the target or at the
temporary name are never written through, and a writer killed mid-write leaves the old file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from ferry.runtime.atomicjson import write_json_atomic


def _tmp_name(path: str, pid: int, tid: int) -> str:
    return f"{path}.tmp-{pid}-{tid}"


@pytest.mark.parametrize("durable", [False, True])
def test_a_symlink_at_the_target_is_replaced_not_followed(tmp_path, durable):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    target = tmp_path / "status.json"
    target.symlink_to(victim)
    write_json_atomic(str(target), {"state": "running"}, durable=durable)
    assert victim.read_text() == "precious"
    assert not target.is_symlink()
    assert json.loads(target.read_text()) == {"state": "running"}
    assert os.stat(target).st_mode & 0o777 == 0o600


def test_a_symlink_at_the_temporary_name_is_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    target = tmp_path / "status.json"
    target.write_text('{"old": 1}')
    planted = tmp_path / _tmp_name("status.json", os.getpid(), threading.get_ident())
    planted.symlink_to(victim)
    write_json_atomic(str(target), {"new": 2})
    assert victim.read_text() == "precious"
    assert json.loads(target.read_text()) == {"new": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json", "victim.txt"]


_WRITER = """
import os, sys, time
from ferry.runtime.atomicjson import write_json_atomic

class Slow:
    # Serialised through default=str: the writer is in the middle of the document, part of
    # it already in the temporary file, when the parent kills it.
    def __str__(self):
        open(sys.argv[2], "w").close()
        time.sleep(60)
        return "never"

write_json_atomic(sys.argv[1], {"a": "x" * 100_000, "b": Slow(), "c": 1}, durable=True)
"""


def test_a_writer_killed_mid_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "claim.json"
    write_json_atomic(str(target), {"step": 1}, durable=True)
    started = tmp_path / "in-the-middle"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(target), str(started)])
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert proc.poll() is None, "the writer ended before it was in the middle of its write"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        leftovers = [p for p in tmp_path.iterdir() if p.name.startswith("claim.json.tmp-")]
        assert len(leftovers) == 1 and leftovers[0].stat().st_size > 0  # part of it written
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert json.loads(target.read_text()) == {"step": 1}
    write_json_atomic(str(target), {"step": 2}, durable=True)  # a later writer is not in its way
    assert json.loads(target.read_text()) == {"step": 2}


def test_an_error_while_writing_removes_the_temporary_file(tmp_path):
    target = tmp_path / "job.json"
    target.write_text('{"id": "a"}')
    with pytest.raises(ValueError):
        write_json_atomic(str(target), {"x": float("nan"), "y": [1, 2]} | {"z": _Circular()})
    assert target.read_text() == '{"id": "a"}'
    assert [p.name for p in tmp_path.iterdir()] == ["job.json"]


class _Circular:
    def __str__(self) -> str:
        raise ValueError("cannot be written")
