"""What /proc says about processes: their group, whether they are alive, their environment;
and stopping a child process."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

from ferry.knobs import STOP_PROCESS_SECONDS


def _stat(pid: str) -> tuple[bytes, bytes, bytes] | None:
    """(state, parent, process group) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (fields[0], fields[1], fields[2]) if len(fields) > 2 else None


def _pids() -> list[str]:
    return [n for n in os.listdir("/proc") if n.isdigit()] if os.path.isdir("/proc") else []


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    group = str(pgid).encode()
    found = []
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None and stat[2] == group and stat[0] != b"Z":
            found.append(int(pid))
    return sorted(found)


def parents() -> dict[int, int]:
    """Every live (non-zombie) process and its parent."""
    found = {}
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None and stat[0] != b"Z":
            found[int(pid)] = int(stat[1])
    return found


def descendants(root: int) -> list[int]:
    """``root`` and its live descendants (a launcher's children may each lead a session of
    their own, so the process group alone does not hold them)."""
    tree = parents()
    found, grew = {root} if root in tree else set(), True
    while grew:
        more = {pid for pid, ppid in tree.items() if ppid in found} - found
        found |= more
        grew = bool(more)
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
        if stat is not None and stat[0] != b"Z" and stat[2] != group:
            found.append(int(pid))
    return sorted(found)


def environ_has(pid: int, name: str) -> bool:
    """Does process ``pid``'s environment (as it started) set ``name``?"""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return any(item.startswith(name.encode() + b"=") for item in f.read().split(b"\0"))
    except OSError:
        return False


def stop_process(proc: subprocess.Popen[bytes], timeout: float = STOP_PROCESS_SECONDS) -> None:
    """SIGTERM a child, SIGKILL it after ``timeout`` seconds; returns once it is gone."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def own_process(hook: Callable[[], None]) -> Callable[[], None]:
    """``hook``, run only in the process that made it: a forked child inherits exit hooks
    (DataLoader workers run ``threading``'s at their end; a script's own ``os.fork`` child
    runs ``atexit``'s), and must not close the parent's session or write its status."""
    pid = os.getpid()

    def hook_in_own_process() -> None:
        if os.getpid() == pid:
            hook()

    return hook_in_own_process
