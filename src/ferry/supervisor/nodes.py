"""What ``ferry run`` claims at start: its job directory and its checkpoint root's lock, for a
job on one node or for one node of a job on many (docs/jobs.md, "Running on many nodes").

On one node, the job directory is ``<FERRY_HOME>/jobs/<id>`` and the root's lock is the
job's alone, as ever. On many nodes, each node's supervisor claims a directory of its own,
``<id>@<node>`` (so that a FERRY_HOME shared by the nodes works), and holds the root's lock
shared with the job's other nodes, plus a lock of its node in the root. A node is named by
its index where the launch fixes it (``node<rank>``: a second supervisor for the same node
is refused), else by its host, taking the host's next free slot (``<host>-2``, ...) when
several nodes of the job run on one host.
"""

from __future__ import annotations

import os
import socket
import time

from ferry.errors import JobError
from ferry.runtime.jobdir import JobDir, node_dir_name
from ferry.runtime.launch import Nodes
from ferry.runtime.rootlock import HOST_SLOTS, RootLock


def claim_job_dir(job_id: str, nodes: Nodes) -> tuple[JobDir, str | None]:
    """The job directory, locked by this supervisor, and this node's name (None: one node).
    JobError when the job (or this node of it) is already running."""
    if not nodes.many:
        job = JobDir.create(job_id)
        job.acquire_lock()
        return job, None
    key, exact = nodes.key(), nodes.rank is not None
    for slot in range(1 if exact else HOST_SLOTS):
        node = key if slot == 0 else f"{key}-{slot + 1}"
        job = JobDir.create(job_id, name=node_dir_name(job_id, node))
        try:
            job.acquire_lock()
        except JobError:
            if exact:
                raise JobError(
                    f"{node} of job {job_id} is already running (its lock {job.file('lock')} is held): "
                    "stop it first, or give this node another rank"
                ) from None
            continue
        return job, node
    raise JobError(f"job {job_id} already runs {HOST_SLOTS} nodes on host {key} with this FERRY_HOME")


def claim_root(root: str, job_id: str, nodes: Nodes, node: str | None, job_dir: str) -> RootLock | None:
    """The checkpoint root's lock (None for a remote root): the job's alone on one node,
    shared with the job's other nodes on many."""
    if node is None:
        return RootLock.acquire(root, job_id)
    record = {
        "host": socket.gethostname(),
        "supervisor_pid": os.getpid(),
        "job_dir": job_dir,
        "nodes": nodes.count,
        "started": time.time(),
    }
    return RootLock.share(root, job_id, node, record, exact=nodes.rank is not None)
