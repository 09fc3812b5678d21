"""The remote for the ``remote-down`` fault: an S3 server of the soak's own (moto's, on
loopback) that the job copies each committed checkpoint to (``FERRY_REMOTE``), reached
through a relay the soak can cut.

While the relay is down every open connection is reset and new ones are refused, which is
what a client sees of a server that restarts or of a network that drops. The server behind
it keeps running and keeps its data, and the relay comes back on the same port, so what is
tested is the client: ferry's retries, its refusal to commit a partial copy, its next copy
once the server is back.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from ferry.errors import JobError
from ferry.knobs import (
    PROCESS_POLL_SECONDS,
    RELAY_CONNECT_SECONDS,
    RELAY_POLL_SECONDS,
    RELAY_REBIND_SECONDS,
    SERVER_START_SECONDS,
)
from ferry.runtime.procs import stop_process
from ferry.storage import Storage, open_storage

BUCKET = "ferry-chaos"
KEY, SECRET, REGION = "ferry-chaos-key", "ferry-chaos-secret", "us-east-1"


def start_moto(workdir: str, port: int = 0) -> tuple[subprocess.Popen[bytes], str]:
    """moto's S3 server in a process of its own on 127.0.0.1:``port`` (0: a free one), its
    log in ``workdir/moto.log``. Returns the process and the server's URL once it serves;
    JobError with the log's tail when it does not start."""
    os.makedirs(workdir, exist_ok=True)
    log_path = os.path.join(workdir, "moto.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
        )
    deadline = time.monotonic() + SERVER_START_SECONDS
    while time.monotonic() < deadline:
        with open(log_path, errors="replace") as f:
            if m := re.search(r"Running on (http://127\.0\.0\.1:\d+)", f.read()):
                return proc, m[1]
        if proc.poll() is not None:
            break
        time.sleep(PROCESS_POLL_SECONDS)
    stop_process(proc)
    with open(log_path, errors="replace") as f:
        tail = f.read()[-2000:]
    raise JobError(f"moto's S3 server did not start (exit code {proc.returncode}); its log ends:\n{tail}")


class Relay:
    """A TCP relay on 127.0.0.1 in front of ``target``; ``down()`` and ``up()``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self.up()

    @property
    def is_up(self) -> bool:
        return self._listener is not None

    def up(self) -> None:
        """Listen again, on the same port as before (retried while the port is in TIME_WAIT)."""
        with self._lock:
            if self._listener is not None:
                return
            deadline = time.monotonic() + RELAY_REBIND_SECONDS
            while True:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    listener.bind(("127.0.0.1", self.port))
                    break
                except OSError as exc:
                    listener.close()
                    if time.monotonic() > deadline:
                        raise JobError(f"the relay cannot listen on port {self.port} again: {exc}") from exc
                    time.sleep(RELAY_POLL_SECONDS)
            listener.listen(128)
            listener.settimeout(RELAY_POLL_SECONDS)
            self.port = listener.getsockname()[1]
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), name="chaos-relay", daemon=True).start()

    def down(self) -> None:
        """Refuse new connections and reset every open one."""
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._open = self._open, set()
        if listener is not None:
            with contextlib.suppress(OSError):  # stops listening now; close() alone would
                listener.shutdown(socket.SHUT_RDWR)  # wait for the accept() under way
            listener.close()
        for conn in conns:
            # SO_LINGER 0: the close that follows sends a reset, as a dead server's host does.
            # shutdown() wakes the pumps blocked in recv() (a close() from here would not).
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.shutdown(socket.SHUT_RDWR)

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=RELAY_CONNECT_SECONDS)
            except OSError:
                client.close()
                continue
            client.settimeout(None)
            server.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # went down meanwhile
                    client.close()
                    server.close()
                    return
                self._open |= {client, server}
            pumps = [2]  # the second pump to end closes both sockets
            for src, dst in ((client, server), (server, client)):
                threading.Thread(
                    target=self._pump, args=(src, dst, pumps), name="chaos-relay", daemon=True
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, pumps: list[int]) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)  # pass the half-close on
        except OSError:  # one side broke, or the relay went down: end the other pump too
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        finally:
            with self._lock:
                pumps[0] -= 1
                last = pumps[0] == 0
                if last:
                    self._open -= {src, dst}
            if last:
                src.close()
                dst.close()


class S3Remote:
    """moto's S3 server in a process of its own, behind a :class:`Relay`."""

    def __init__(self, workdir: str) -> None:
        self._up_at: float | None = None
        self._down_since: float | None = None
        self.down_seconds = 0.0
        """Seconds the remote was unreachable, in all."""
        self._proc, self.server_url = start_moto(workdir)
        try:
            host, port = self.server_url.rsplit("//", 1)[1].split(":")
            self.relay = Relay((host, int(port)))
            import s3fs

            s3fs.S3FileSystem(endpoint_url=self.server_url, key=KEY, secret=SECRET).mkdir(BUCKET)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def available() -> str | None:
        """None when usable here, else why not."""
        missing = [m for m in ("moto", "flask", "s3fs") if importlib.util.find_spec(m) is None]
        if missing:
            return f"needs moto[server] and s3fs (no {', '.join(missing)}): pip install 'moto[server]' s3fs"
        return None

    # ---------------------------------------------------------------- the job's side
    def env(self, prefix: str) -> dict[str, str]:
        """What the job needs to copy its checkpoints to ``s3://BUCKET/prefix`` through the relay."""
        return {
            "FERRY_REMOTE": f"s3://{BUCKET}/{prefix}",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.relay.port}",
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def storage(self, prefix: str) -> Storage:
        """The job's remote root, reached directly (not through the relay)."""
        options: dict[str, Any] = {"endpoint_url": self.server_url, "key": KEY, "secret": SECRET}
        return open_storage(f"s3://{BUCKET}/{prefix}", **options)

    # ---------------------------------------------------------------- outages
    def outage(self, seconds: float) -> None:
        """Down now, back up ``seconds`` from now (an outage under way is extended)."""
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        self.relay.down()
        self._up_at = max(self._up_at or now, now + seconds)

    @property
    def is_down(self) -> bool:
        return self._up_at is not None

    def tick(self) -> None:
        """Bring the relay back once the outage is over; call it often."""
        if self._up_at is not None and time.monotonic() >= self._up_at:
            self.restore()

    def restore(self) -> None:
        """Back up now."""
        if self._down_since is not None:
            self.down_seconds += time.monotonic() - self._down_since
        self._up_at = self._down_since = None
        self.relay.up()

    def close(self) -> None:
        relay = getattr(self, "relay", None)  # None when __init__ failed before it
        if relay is not None:
            relay.down()
        stop_process(self._proc)
