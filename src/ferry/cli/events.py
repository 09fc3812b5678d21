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
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ferry.knobs import PROCESS_POLL_SECONDS
from ferry.runtime.events import parse_event
from ferry.runtime.jobdir import report_dropped


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
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:  # not there yet
            return
        end = data.rfind(b"\n") + 1  # a line still being written waits for its newline
        for line in data[:end].splitlines():
            try:
                event = parse_event(json.loads(line), report_dropped, self.path)
            except ValueError:
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
