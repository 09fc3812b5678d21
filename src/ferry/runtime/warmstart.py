"""The wire between ``ferry run`` and a warm worker (docs/jobs.md, "Warm migration"): torch-free,
so that the supervisor and the worker share it.

The supervisor hands the warm worker four inherited descriptors, named in ``FERRY_WARM`` as
``GO,READY,OUT,ERR``: the worker writes ``READY`` to READY when it waits at its restore point,
then reads GO: ``GO`` takes over, end of file means it is discarded. OUT and ERR are the job's
real stdout and stderr, for after the take-over (until then it writes to buffers).

A warm worker is started with SIGKILL as its parent-death signal: until it takes over it
never trained, and has nothing to save. From the take-over on it is the job's worker, and
gets the signal a cold-started worker gets when ``ferry run`` dies (``parent_death_signal``):
it checkpoints and stops (``take_parent_death``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence
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


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def parent_death_signal(stop_signals: Sequence[str]) -> int:
    """What a worker gets when ``ferry run`` dies (SIGKILLed): a stop signal, so that it
    checkpoints and stops rather than trains on unsupervised: SIGTERM, or the first of
    ``stop_signals`` when SIGTERM is not one of them."""
    name = "SIGTERM" if "SIGTERM" in stop_signals or not stop_signals else stop_signals[0]
    return int(getattr(signal, name))


def take_parent_death(signum: int, parent: int) -> None:
    """A warm worker that takes over: from now on it gets ``signum`` when its supervisor
    (pid ``parent``) dies, as a cold-started worker does. A supervisor that died before the
    call is caught by comparing the parent pid: the signal is then raised here at once (the
    stop's handler, where one is installed, checkpoints at the next safe point)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signum), 0, 0, 0)
    if os.getppid() != parent:
        signal.raise_signal(signum)
