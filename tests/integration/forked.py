"""The client side of forkserver.py: start a training script as a forked child of a server
that has torch and ferry imported already, and handle it like a ``subprocess.Popen``."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

SERVER = Path(__file__).with_name("forkserver.py")
_lock = threading.Lock()
_server: tuple[subprocess.Popen[bytes], str] | None = None


def _socket_path() -> str:
    """The server of this process (one per pytest worker), started on first use."""
    global _server
    with _lock:
        if _server is not None and _server[0].poll() is None:
            return _server[1]
        folder = tempfile.mkdtemp(prefix="ferry-forkserver-")
        path = os.path.join(folder, "sock")
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen([sys.executable, str(SERVER), path], env=env, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the fork server did not start (exit {proc.wait()})")
        atexit.register(_stop, proc)
        _server = (proc, path)
        return path


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


class Forked:
    """A forked child: ``pid``, ``poll``, ``wait``, ``communicate``, ``send_signal``,
    ``kill``, ``terminate``, ``returncode``, and ``stdout``/``stderr`` pipes (text) when
    asked for with ``subprocess.PIPE``, as ``subprocess.Popen`` has them."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        cwd: str | None = None,
        stdout: int | None = subprocess.PIPE,
        stderr: int | None = subprocess.PIPE,
        start_new_session: bool = False,
    ) -> None:
        self.args = list(argv)
        self.returncode: int | None = None
        self.stdout: TextIO | None = None
        self.stderr: TextIO | None = None
        mine: list[int] = []  # our ends of the pipes
        theirs: list[int] = []
        for target, parent_fd in ((stdout, 1), (stderr, 2)):
            if target == subprocess.PIPE:
                r, w = os.pipe()
                mine.append(r)
                theirs.append(w)
            elif target == subprocess.DEVNULL:
                theirs.append(os.open(os.devnull, os.O_WRONLY))
            elif target is None:
                theirs.append(os.dup(parent_fd))
            else:
                theirs.append(os.dup(target))
        stdin = os.open(os.devnull, os.O_RDONLY)
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.connect(_socket_path())
            request = {
                "argv": self.args,
                "env": env,
                "cwd": cwd or os.getcwd(),
                "new_session": start_new_session,
            }
            socket.send_fds(self._conn, [json.dumps(request).encode()], [stdin, *theirs])
        finally:
            for fd in (stdin, *theirs):
                os.close(fd)
        it = iter(mine)
        if stdout == subprocess.PIPE:
            self.stdout = open(next(it), encoding="utf-8", errors="replace")  # noqa: SIM115
        if stderr == subprocess.PIPE:
            self.stderr = open(next(it), encoding="utf-8", errors="replace")  # noqa: SIM115
        self._buffer = b""
        self._readers: list[threading.Thread] | None = None
        self._output: dict[str, str] = {}
        self.pid = int(self._message(None)["pid"])

    def _message(self, timeout: float | None) -> dict[str, int]:
        self._conn.settimeout(timeout)
        while b"\n" not in self._buffer:
            chunk = self._conn.recv(4096)
            if not chunk:
                raise RuntimeError("the fork server went away")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)  # type: ignore[no-any-return]

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.wait(0.001)
            except subprocess.TimeoutExpired:
                return None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                status = self._message(timeout)["status"]
            except (TimeoutError, BlockingIOError):
                raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
            self.returncode = os.waitstatus_to_exitcode(status)
            self._conn.close()
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Read both pipes to their end, then wait, like ``Popen.communicate`` (which may be
        called again after a ``TimeoutExpired``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._readers is None:
            self._readers = [
                threading.Thread(target=self._drain, args=(name,), daemon=True)
                for name in ("stdout", "stderr")
                if getattr(self, name) is not None
            ]
            for t in self._readers:
                t.start()
        for t in self._readers:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(0.001, deadline - time.monotonic()))
        return self._output.get("stdout"), self._output.get("stderr")

    def _drain(self, name: str) -> None:
        stream = getattr(self, name)
        self._output[name] = stream.read()
        stream.close()

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def run_forked(
    argv: Sequence[str], env: dict[str, str], *, timeout: float, new_session: bool = False
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=...)`` through the
    fork server: ``argv[0]`` is the script."""
    proc = Forked(argv, env=env, start_new_session=new_session)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode or 0, out or "", err or "")
