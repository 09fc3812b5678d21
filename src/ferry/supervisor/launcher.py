"""How ``ferry run`` starts its job's workers: the job's command, in the environment the
options, ``--env`` and the in-place restarts so far make, holding the job's locks."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ferry.runtime.warmstart import parent_death_signal
from ferry.supervisor.options import RunOptions
from ferry.supervisor.warm import WarmRequest, WarmWorker
from ferry.supervisor.worker import WorkerGroup, handoff_dir, user_env, worker_env


@dataclass(kw_only=True)
class Launcher:
    """Starts workers (cold, warm for a migration, warm and gated for ``ferry resume --warm``)
    of one job whose directory and checkpoint root are claimed."""

    command: list[str]
    options: RunOptions
    job_id: str
    job_dir: str
    checkpoint_dir: str
    locks: tuple[int, ...]
    """The job's lock and its checkpoint root's: the worker holds them too, so that they stay
    held while it lives, whatever happens to the supervisor."""
    restart_env: dict[str, str | None] = field(default_factory=dict)
    """What the in-place restarts so far set (None: unset), for every later worker."""

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A worker's whole environment; ``extra``: a warm request's, over the restarts'."""
        user = user_env(os.environ, self.options, {**self.restart_env, **(extra or {})})
        return worker_env(
            user,
            self.options,
            job_id=self.job_id,
            job_dir=self.job_dir,
            checkpoint_dir=self.checkpoint_dir,
            handoff_dir=handoff_dir(self.job_dir) if os.path.isdir("/dev/shm") else None,
        )

    def cold(self) -> WorkerGroup:
        """The job's next worker (OSError when it cannot start). It gets a stop signal when
        the supervisor dies (SIGKILLed), so that it checkpoints and stops rather than trains
        on unsupervised."""
        pdeathsig = parent_death_signal(self.options.stop_signals)
        return WorkerGroup(self.command, self.env(), locks=self.locks, pdeathsig=pdeathsig)

    def warm(self, request: WarmRequest) -> WarmWorker:
        """The warm worker of a migration: the request's env over the job's."""
        env = self.env(request.env)
        return WarmWorker(self.command, env, locks=self.locks, rid=request.id, expires=request.expires)

    def gated(self) -> WarmWorker:
        """The first worker, started warm (``ferry resume --warm``): nobody's request, no expiry."""
        return WarmWorker(self.command, self.env(), locks=self.locks, rid="", expires=math.inf)
