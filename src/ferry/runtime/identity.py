"""The default name of a job, where neither the user nor a scheduler gave one."""

from __future__ import annotations

import os
import re
import socket


def default_job_id(pid: int | None = None) -> str:
    """``<host>-<pid>``: unique on this machine while the process lives, and readable in
    ``ferry list``. ``pid`` defaults to this process's: the supervisor's, or the worker's
    when it runs without ``ferry run``."""
    return f"{socket.gethostname()}-{os.getpid() if pid is None else pid}"


# ---------------------------------------------------------------------- jobs on many nodes
def rendezvous_job_id(rendezvous: str) -> str:
    """A job on many nodes without a scheduler's id nor ``--job-id``: every node's ``ferry
    run`` sees the same torchrun rendezvous (``ferry.runtime.launch.Nodes.rendezvous``), so
    each names the job ``torchrun-<rendezvous>`` alike, and running the same command again
    resumes it. Characters a folder name should not hold become ``-``."""
    return "torchrun-" + re.sub(r"[^A-Za-z0-9._-]", "-", rendezvous.replace("@", "-").replace(":", "-"))
