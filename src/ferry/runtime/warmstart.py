"""The wire between ``ferry run`` and a warm worker (docs/jobs.md, "Warm migration"): torch-free,
so that the supervisor and the worker share it.

The supervisor hands the warm worker four inherited descriptors, named in ``FERRY_WARM`` as
``GO,READY,OUT,ERR``: the worker writes ``READY`` to READY when it waits at its restore point,
then reads GO: ``GO`` takes over, end of file means it is discarded. OUT and ERR are the job's
real stdout and stderr, for after the take-over (until then it writes to buffers).
"""

from __future__ import annotations

from dataclasses import dataclass

from ferry.errors import ConfigError

ENV = "FERRY_WARM"
GO = b"g"
READY = b"r"


@dataclass(frozen=True, kw_only=True)
class WarmFds:
    go: int
    """Read: ``GO`` to take over, end of file to leave."""
    ready: int
    """Written once, at the restore point."""
    out: int
    """The job's real stdout, for after the take-over."""
    err: int
    """The job's real stderr."""

    def to_env(self) -> str:
        return f"{self.go},{self.ready},{self.out},{self.err}"


def parse(value: str) -> WarmFds:
    """``FERRY_WARM``'s value: four descriptor numbers, comma-separated."""
    parts = value.split(",")
    if len(parts) != 4 or not all(p.isdigit() and len(p) < 8 for p in parts):
        raise ConfigError(
            f"{ENV}={value!r} is not four descriptor numbers: it is set by `ferry run` for a warm "
            "worker only; unset it"
        )
    go, ready, out, err = (int(p) for p in parts)
    return WarmFds(go=go, ready=ready, out=out, err=err)
