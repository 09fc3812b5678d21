"""A job that ran this very command and left checkpoints elsewhere: a run that finds no
checkpoint of its own points to it, since a changed --dir or --job-id is the usual reason
for a resume that silently starts from scratch."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ferry.runtime.jobdir import JobDir, jobs_root


@dataclass(frozen=True, kw_only=True)
class CheckpointedJob:
    id: str
    checkpoint_dir: str
    step: int


def checkpointed_job(argv: Sequence[str], cwd: str, *, not_dir: str, not_id: str) -> CheckpointedJob | None:
    """The job under FERRY_HOME, other than ``not_id``, whose worker ran ``argv`` in ``cwd``,
    did not finish, and whose newest checkpoint lies outside ``not_dir``; the most recently
    checkpointed one."""
    try:
        names = os.listdir(jobs_root())
    except OSError:
        return None
    best: tuple[float, CheckpointedJob] | None = None
    for name in names:
        if name == not_id:
            continue
        job = JobDir(os.path.join(jobs_root(), name))
        try:
            identity = job.identity()
            status = job.status()
        except PermissionError:  # another user's job: not ours to point at
            continue
        if status.get("state") == "finished":  # nothing to resume: its root says so too
            continue
        last = status.get("last_checkpoint")
        ck_dir = identity.get("checkpoint_dir")
        if last is None or ck_dir is None or identity.get("argv") != list(argv):
            continue
        if identity.get("cwd", cwd) != cwd or os.path.abspath(ck_dir) == os.path.abspath(not_dir):
            continue
        if best is None or last["time"] > best[0]:
            best = (last["time"], CheckpointedJob(id=name, checkpoint_dir=ck_dir, step=last["step"]))
    return None if best is None else best[1]
