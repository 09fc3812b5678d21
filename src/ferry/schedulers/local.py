"""No batch system: ``ferry run`` itself is the scheduler; nothing to requeue."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ferry.schedulers.base import AdapterDefaults


@dataclass(frozen=True)
class LocalAdapter(AdapterDefaults):
    name: str = "local"
    stop_signal: str = "SIGTERM"


def detect(env: Mapping[str, str]) -> LocalAdapter:
    return LocalAdapter()
