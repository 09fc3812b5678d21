"""The default name of a job, where neither the user nor a scheduler gave one."""

from __future__ import annotations

import os
import socket


def default_job_id(pid: int | None = None) -> str:
    """``<host>-<pid>``: unique on this machine while the process lives, and readable in
    ``ferry list``. ``pid`` defaults to this process's: the supervisor's, or the worker's
    when it runs without ``ferry run``."""
    return f"{socket.gethostname()}-{os.getpid() if pid is None else pid}"
