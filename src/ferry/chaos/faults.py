"""The local faults' tools: killing a process tree, a checkpoint filesystem that can be
filled. (The remote's outages: ferry.chaos.remote.)"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time

from ferry.errors import JobError
from ferry.knobs import KILL_TREE_SECONDS, PROCESS_POLL_SECONDS
from ferry.runtime.procs import descendants, group_members, parents


def kill_tree(root: int, timeout: float = KILL_TREE_SECONDS) -> None:
    """SIGKILL the process group ``root`` leads and every descendant of ``root``."""
    deadline = time.monotonic() + timeout
    pids = set(descendants(root)) | set(group_members(root))
    while pids:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise JobError(f"processes {sorted(pids)} survive SIGKILL")
        time.sleep(PROCESS_POLL_SECONDS)
        alive = parents()
        pids = {p for p in pids if p in alive}


def leaves(root: int) -> list[int]:
    """The processes of ``root``'s tree that have no children: the training processes
    (the worker itself, or the ranks under a launcher such as torchrun)."""
    tree = descendants(root)
    alive = parents()
    return [p for p in tree if not any(alive.get(c) == p for c in tree)] or [root]


class DiskFiller:
    """A small tmpfs of our own holding the checkpoints; ``fill()`` leaves no room on it."""

    def __init__(self, mountpoint: str, size_mb: int = 512) -> None:
        self.mountpoint = mountpoint
        self.ballast = os.path.join(mountpoint, ".chaos-ballast")
        os.makedirs(mountpoint, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", mountpoint],
            check=True,
            capture_output=True,
        )

    @staticmethod
    def available() -> str | None:
        """None when usable here, else why not."""
        if os.geteuid() != 0:
            return "needs root, to mount a small tmpfs for the checkpoints"
        if shutil.which("mount") is None:
            return "no mount command"
        return None

    def fill(self) -> None:
        st = os.statvfs(self.mountpoint)
        with open(self.ballast, "wb") as f, contextlib.suppress(OSError):
            chunk = b"\0" * (1 << 20)
            for _ in range(st.f_bavail * st.f_frsize // len(chunk) + 1):
                f.write(chunk)
            f.flush()

    def drain(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.ballast)

    def close(self) -> None:
        self.drain()
        subprocess.run(["umount", "-l", self.mountpoint], check=False, capture_output=True)
