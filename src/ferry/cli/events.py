"""``ferry run --json``: the job's events, one JSON object a line on stdout, for wrappers.

The events are the lines the supervisor and the worker's session append to the job's
``events.jsonl`` (docs/jobs.md): ``run_start``, ``worker_start``, ``checkpoint``,
``signal``, ``stop``, ``worker_exit``, ``restart``, ``resume``, ``failed``, ``run_end``
(the last one, with ``exit_code``). They are followed from the file rather than hooked into
the supervisor, so a wrapper sees exactly what the job directory records, each line parsed as
``ferry.runtime.events`` declares its kind (what ``ferry report`` reads too). While they flow,
stdout belongs to them: the command's own stdout goes to stderr.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ferry.knobs import PROCESS_POLL_SECONDS
from ferry.runtime.events import MAX_EVENT_BYTES, parse_event
from ferry.runtime.jobdir import report_dropped
from ferry.typedjson import loads

CHUNK_BYTES = 4 << 20
"""The most one drain reads: a job that appends faster is followed over several drains."""


class EventFollower:
    """Copies the lines appended to ``path`` after it was made to ``fd``, until ``stop``."""

    def __init__(self, path: str, fd: int) -> None:
        self.path, self.fd = path, fd
        try:
            self.offset = os.path.getsize(path)  # an earlier run of the same job: not this one's
        except OSError:
            self.offset = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ferry-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        self.drain()  # what came between the last poll and the end

    def _loop(self) -> None:
        while not self._done.wait(PROCESS_POLL_SECONDS):
            self.drain()

    def drain(self) -> None:
        """Copy the whole lines appended since the last drain, at most ``CHUNK_BYTES`` of them.
        Only a regular file is read: a symlink is not followed, a FIFO (which would block the
        follower, and ``ferry run`` at its end) not opened for reading."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # not there yet, or a link: nothing the job directory counts
            return
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            f.seek(self.offset)
            data = f.read(CHUNK_BYTES)
        end = data.rfind(b"\n") + 1  # a line still being written waits for its newline
        if end == 0 and len(data) == CHUNK_BYTES:  # a line longer than any event's: skipped
            end = len(data)
        for line in data[:end].splitlines():
            if len(line) > MAX_EVENT_BYTES:
                continue
            try:
                event = parse_event(loads(line), report_dropped, self.path)
            except ValueError:  # not JSON, or nested too deep
                continue
            if event is None:  # not an event (no time, no kind): the job directory skips it too
                continue
            os.write(self.fd, (json.dumps(event, separators=(",", ":"), default=str) + "\n").encode())
        self.offset += end


@contextmanager
def events_on_stdout(path: str) -> Iterator[None]:
    """Within: the job's new events go to stdout, everything else written to stdout (the
    worker inherits it) to stderr. Stdout is given back on the way out, errors included."""
    sys.stdout.flush()
    events_fd = os.dup(1)
    os.dup2(2, 1)
    follower = EventFollower(path, events_fd)
    follower.start()
    try:
        yield
    finally:
        follower.stop()
        sys.stdout.flush()
        os.dup2(events_fd, 1)
        os.close(events_fd)
