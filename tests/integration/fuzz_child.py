"""The fuzzers' forked children (fuzz_checkpoints.py, fuzz_frames.py): read the JSON lines a
child writes to its pipe until it ends or its time is up (then it is SIGKILLed)."""

from __future__ import annotations

import json
import os
import select
import signal
import time
from typing import Any


def wait_child(pid: int, r: int, timeout: float) -> tuple[list[dict[str, Any]], int]:
    """The results the child ``pid`` wrote to the pipe ``r`` (one JSON object a line) and how
    it ended: its exit code, or minus the signal that ended it."""
    results: list[dict[str, Any]] = []
    buf = b""
    deadline = time.monotonic() + timeout
    with os.fdopen(r, "rb", buffering=0) as pipe:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                break
            if not select.select([pipe], [], [], left)[0]:
                continue
            chunk = pipe.read(1 << 16)
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            results.extend(json.loads(line) for line in lines if line)
    _, status = os.waitpid(pid, 0)
    return results, (os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status))
