"""Scheduler adapters (SLURM, HTCondor, Kubernetes, local): see ``base.SchedulerAdapter``.

``REGISTRY`` maps a name to the module that detects it, imported lazily; detection asks
each in order and the first that recognises its environment wins (``local`` last).
``FERRY_SCHEDULER=<name>`` forces one.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping

from ferry.errors import ConfigError
from ferry.schedulers.base import SchedulerAdapter

REGISTRY: dict[str, str] = {
    "slurm": "ferry.schedulers.slurm",
    "htcondor": "ferry.schedulers.htcondor",
    "kubernetes": "ferry.schedulers.kubernetes",
    "local": "ferry.schedulers.local",
}
"""Name -> module with a ``detect(env) -> adapter | None`` function; order is priority."""


def _detect_with(name: str, env: Mapping[str, str]) -> SchedulerAdapter | None:
    module = importlib.import_module(REGISTRY[name])
    adapter: SchedulerAdapter | None = module.detect(env)
    return adapter


def detect(env: Mapping[str, str] | None = None) -> SchedulerAdapter:
    """The adapter for the scheduler running this process (``local`` when none is)."""
    env = os.environ if env is None else env
    forced = env.get("FERRY_SCHEDULER")
    if forced:
        if forced not in REGISTRY:
            raise ConfigError(f"FERRY_SCHEDULER={forced!r}: use one of {', '.join(REGISTRY)}")
        adapter = _detect_with(forced, {**env, "FERRY_SCHEDULER_FORCED": "1"})
        if adapter is None:
            raise ConfigError(f"FERRY_SCHEDULER={forced}, but this is not a {forced} job")
        return adapter
    for name in REGISTRY:
        found = _detect_with(name, env)
        if found is not None:
            return found
    raise AssertionError("the local adapter always matches")


__all__ = ["REGISTRY", "SchedulerAdapter", "detect"]
