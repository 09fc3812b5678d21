"""The scheduler extension point: what a batch system means by "stop", and how to come back.

An adapter is mostly data. The calls, in order:

1. ``detect(env)`` (a module-level factory per backend, in the registry of
   ``ferry.schedulers``): returns the adapter when its scheduler runs this process, else
   None. The first match wins; ``local`` always matches and comes last.
2. The supervisor (``ferry run``), once at start: ``job_id()`` names the job when the
   user gave no ``--job-id`` (stable across the scheduler's restarts, so the job resumes
   from its own checkpoints); ``restart_count()`` is recorded in ``job.json``;
   ``exit_code(default)`` is the "checkpointed, resume me" status to use.
3. The worker's ``Config.from_env``: ``worker_defaults()``, settings under FERRY_* vars.
4. The supervisor, after the worker exited with the checkpoint code on a stop (so after
   the checkpoint is committed) and after it recorded the job's end (status, events):
   ``after_checkpoint(step, code, state_dir)`` hands the job back to the scheduler
   (SLURM: ``scontrol requeue``) and returns the supervisor's exit status, ``code``. It is
   the supervisor's last act, because the scheduler may kill it as soon as it has asked.
5. The worker, after each committed checkpoint: ``grace_warning(seconds)`` says when the
   scheduler's grace period is too short for a save of that length (Kubernetes).

Adapters raise nothing from these calls: what fails is logged with its fix, because the
checkpoint has already landed and must stay the outcome.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class SchedulerAdapter(Protocol):
    name: str
    """The registry name: ``slurm``, ``htcondor``, ``kubernetes``, ``local``."""
    stop_signal: str
    """The signal the scheduler sends ahead of its kill (SIGTERM, or SLURM's --signal)."""

    def job_id(self) -> str | None: ...

    def restart_count(self) -> int: ...

    def exit_code(self, default: int) -> int: ...

    def worker_defaults(self) -> dict[str, Any]: ...

    def after_checkpoint(self, *, step: int | None, code: int, state_dir: str) -> int: ...

    def grace_warning(self, save_seconds: float) -> str | None:
        """After each committed checkpoint (the worker): a warning when the scheduler's
        grace period cannot fit a save of this length, else None."""
        ...


class AdapterDefaults:
    """What an adapter does where its scheduler adds nothing: no job id or restart count of
    its own, ferry's exit code and settings, no grace check, nothing after a checkpoint.
    Adapters inherit it and define only what their scheduler changes."""

    def job_id(self) -> str | None:
        return None

    def restart_count(self) -> int:
        return 0

    def exit_code(self, default: int) -> int:
        return default

    def worker_defaults(self) -> dict[str, Any]:
        return {}

    def after_checkpoint(self, *, step: int | None, code: int, state_dir: str) -> int:
        return code

    def grace_warning(self, save_seconds: float) -> str | None:
        return None


class Detector(Protocol):
    def __call__(self, env: Mapping[str, str]) -> SchedulerAdapter | None: ...
