"""A warm worker: started by ``ferry run`` beside the worker it is to replace (a migration),
it runs the script's setup and then waits at its restore point until it is told to take over.

The restore point here is the session's creation: the first ``ferry.track()`` (explicit
mode) or the first ``iter()`` of a DataLoader (zero-code mode), after the script imported
its modules, built its model and optimizer, created its loaders (and its CUDA context, where
the model is on a GPU), and before anything of the job is looked at or written: the
checkpoint to resume does not exist yet. Until it takes over, the warm worker writes no
status, no event, no checkpoint, and what it prints goes to buffers the supervisor gave it
instead of its stdout and stderr (``ferry run`` opens them); at take-over the buffers are
written out to the job's real output, then the output goes there directly. So the job's
output reads as after a cold restart: the new worker's setup lines come after the old
worker's last ones.

The supervisor speaks to it through inherited descriptors (``ferry.runtime.warmstart``): it
says when it reaches the restore point, then waits for the word to take over; end of file
instead (the supervisor discarded it, or died) ends it at once, without running anything of
the script's teardown (it has done nothing that needs it).
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Sequence

from ferry.runtime.warmstart import ENV, GO, READY, WarmFds, parent_death_signal, parse, take_parent_death

DISCARDED_EXIT = 0
"""The exit status of a warm worker that is discarded before taking over: nothing failed."""


def wait_for_takeover(stop_signals: Sequence[str]) -> float | None:
    """In a warm worker: wait here until the supervisor says to take over; returns the seconds
    waited (None in any other worker: it returns at once). Never returns when discarded.
    Once it takes over, the supervisor's death sends it the first of ``stop_signals`` (SIGTERM
    where it is one), as to a cold-started worker, instead of the SIGKILL it started with."""
    value = os.environ.pop(ENV, None)  # the script's own subprocesses are no warm workers
    if value is None:
        return None
    fds = parse(value)
    t0 = time.monotonic()
    try:
        os.write(fds.ready, READY)
        os.close(fds.ready)
        word = os.read(fds.go, 1)
    except OSError:
        word = b""
    if word != GO:
        os._exit(DISCARDED_EXIT)  # nothing written, nothing to tear down
    os.close(fds.go)
    supervisor = os.environ.get("FERRY_SUPERVISOR_PID", "")
    if supervisor.isdigit():
        take_parent_death(parent_death_signal(stop_signals), int(supervisor))
    _release_output(fds)
    return time.monotonic() - t0


def _release_output(fds: WarmFds) -> None:
    """Write out what the setup printed into the buffers, then point stdout and stderr at the
    job's real output."""
    for stream, fd, real in ((sys.stdout, 1, fds.out), (sys.stderr, 2, fds.err)):
        if stream is not None:
            stream.flush()
        _copy_buffer(fd, real)
        os.dup2(real, fd)
        os.close(real)
        if fd == 1 and isinstance(stream, io.TextIOWrapper) and os.isatty(1):
            stream.reconfigure(line_buffering=True)  # as Python sets it up on a terminal


def _copy_buffer(fd: int, real: int) -> None:
    offset = 0
    while True:
        try:
            chunk = os.pread(fd, 1 << 16, offset)
        except OSError:  # not a file the supervisor gave (a pipe): nothing buffered to copy
            return
        if not chunk:
            return
        offset += len(chunk)
        view = memoryview(chunk)
        while view:
            try:
                view = view[os.write(real, view) :]
            except OSError:
                return  # the job's output is gone (a closed terminal): the take-over goes on
