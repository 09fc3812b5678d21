"""The default name of a job, where neither the user nor a scheduler gave one.

Under ``ferry run`` a job is what makes it the same job: the scheduler's id where a batch
system runs it (its requeues resume it), otherwise the working directory and the command
line, so that the same command run again in the same place resumes where it stopped
(``local_job_id``). A worker started without ``ferry run`` names itself ``<host>-<pid>``
(``default_job_id``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass


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


# ---------------------------------------------------------------------- one machine
HASH_CHARS = 8
"""Hex digits of the hash in a local job id: 32 bits. Among a thousand jobs of one user,
two share a hash with a chance of about 1 in 10,000 (and the name before it must match too)."""
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def _readable_name(command: Sequence[str]) -> str:
    """The part of a command line a person recognises it by: the script's name (``python
    train.py``, ``torchrun --nproc-per-node 2 train.py`` -> ``train``), the module's
    (``python -m pkg.fit`` -> ``fit``), else the program's."""
    words = list(command)
    for i, word in enumerate(words):
        if word.endswith(".py") and not word.startswith("-"):
            return os.path.splitext(os.path.basename(word))[0]
        if word == "-m" and i + 1 < len(words):
            return words[i + 1].rsplit(".", 1)[-1]
    return os.path.basename(words[0]) if words else "job"


def local_job_id(command: Sequence[str], cwd: str) -> str:
    """``<name>-<hash>``: a short name from the command (``train``) and a stable hash of the
    working directory and the whole command line, so that the same command run in the same
    folder is the same job, and resumes its checkpoints."""
    digest = hashlib.sha256(json.dumps([cwd, list(command)]).encode()).hexdigest()[:HASH_CHARS]
    name = _NAME_CHARS.sub("-", _readable_name(command)).strip("-.")[:24] or "job"
    return f"{name}-{digest}"


@dataclass(frozen=True)
class JobIdentity:
    """A job's id and why it is that one, for the line ``ferry run`` starts with."""

    id: str
    why: str


def choose_identity(
    *,
    given: str | None,
    scheduler: str,
    scheduler_id: str | None,
    command: Sequence[str],
    cwd: str,
    rendezvous: str | None = None,
) -> JobIdentity:
    """The id of a job started by ``ferry run``: ``--job-id`` when given, else the
    scheduler's (``scheduler_id`` from its adapter), else, for a job on many nodes, its
    torchrun rendezvous (``rendezvous``: the same on every node), else ``local_job_id``."""
    if given:
        return JobIdentity(given, "named by --job-id")
    if scheduler_id:
        return JobIdentity(scheduler_id, f"named by the {scheduler} job it runs in (its requeues resume it)")
    if rendezvous:
        return JobIdentity(
            rendezvous_job_id(rendezvous), "named by its torchrun rendezvous, the same on each of its nodes"
        )
    return JobIdentity(
        local_job_id(command, cwd),
        "named by the working directory and the command line: the same command run here again "
        "resumes it, --fresh starts it over",
    )
