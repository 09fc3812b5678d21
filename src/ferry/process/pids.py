"""The process a PID names: checked, alive, and told apart from a later process with its PID."""

from __future__ import annotations

from ferry.errors import ConfigError, ProcessCheckpointError


def check_pid(pid: object) -> int:
    """``pid`` if it is a positive integer; a ConfigError otherwise."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise ConfigError(f"a PID is a positive integer, got {pid!r}")
    return pid


def start_time(pid: int) -> int | None:
    """Clock ticks since boot at which ``pid`` started: tells a process from a later one with its PID."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the name in (...) may hold spaces


def require_alive(pid: int) -> None:
    """Raise, in the operator's words, unless a process with ``pid`` lives here."""
    if start_time(pid) is None:
        raise ProcessCheckpointError(
            f"no process with pid {pid} on this machine (it exited, or lives in another PID namespace)"
        )
