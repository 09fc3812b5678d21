"""No batch system: ``ferry run`` itself is the scheduler; nothing to requeue."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LocalAdapter:
    name: str = "local"
    stop_signal: str = "SIGTERM"

    def job_id(self) -> str | None:
        return None

    def restart_count(self) -> int:
        return 0

    def exit_code(self, default: int) -> int:
        return default

    def worker_defaults(self) -> dict[str, Any]:
        return {}

    def grace_warning(self, save_seconds: float) -> str | None:
        return None

    def after_checkpoint(self, *, step: int | None, code: int, state_dir: str) -> int:
        return code


def detect(env: Mapping[str, str]) -> LocalAdapter:
    return LocalAdapter()
