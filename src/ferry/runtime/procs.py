"""What /proc says about processes: their group, whether they are alive, their environment."""

from __future__ import annotations

import os


def _stat(pid: str) -> tuple[bytes, bytes] | None:
    """(state, process group) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (fields[0], fields[2]) if len(fields) > 2 else None


def _pids() -> list[str]:
    return [n for n in os.listdir("/proc") if n.isdigit()] if os.path.isdir("/proc") else []


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    group = str(pgid).encode()
    found = []
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None and stat[1] == group and stat[0] != b"Z":
            found.append(int(pid))
    return sorted(found)


def tagged(tag: str, outside_group: int) -> list[int]:
    """Live processes whose environment holds ``tag`` (NAME=VALUE), outside ``outside_group``."""
    want, group, me = tag.encode(), str(outside_group).encode(), str(os.getpid())
    found = []
    for pid in _pids():
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if want not in f.read().split(b"\0"):
                    continue
        except OSError:
            continue
        stat = _stat(pid)
        if stat is not None and stat[0] != b"Z" and stat[1] != group:
            found.append(int(pid))
    return sorted(found)
