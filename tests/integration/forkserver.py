"""A fork server for the test suite: imports torch, numpy and ferry once, then forks a child
for each training script run, instead of paying a fresh interpreter and `import torch`
(2-5 s on a small machine) per run.

The child is a real process: it has its own pid, receives real signals, can be SIGKILLed,
and exits with the script's own exit status (``SystemExit`` code, 1 on an uncaught
exception after ``sys.excepthook``, or the signal that killed it). Its stdin, stdout and
stderr are the caller's file descriptors (passed over the socket), its environment,
working directory and ``sys.argv`` are the caller's. It runs in a process group of its
own (a new session when asked), so a script that signals its own group cannot reach the
server.

What is *not* the same as a fresh ``python script.py``: modules the server imported
(torch, numpy, ferry) are not imported again, so anything they read from the environment
at import time is the server's. Tests of start-up behaviour (``ferry run`` workers, the
zero-code start-up hook, ``FERRY_*`` checks at start) therefore keep a real exec; see
``trainrun.spawn``.

Protocol, one Unix stream connection per child:
  client -> server: one JSON line {"argv", "env", "cwd", "new_session"} with the child's
                    stdin, stdout and stderr as SCM_RIGHTS file descriptors;
  server -> client: {"pid": N} once the child is forked, then {"status": S} (a raw wait
                    status) when it has exited; then the server closes the connection.
The server is single-threaded (fork from a threaded process is unsafe): one selector loop
over the listening socket, the clients and a SIGCHLD wake-up pipe.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
from typing import Any

MAX_REQUEST = 1 << 20


class Child:
    """What a forked child runs once it has left the server's loop."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.argv: list[str] = list(request["argv"])

    def run(self) -> None:
        """Run the script as ``python script.py`` would, then leave as the interpreter does
        (threads joined, atexit callbacks run, output flushed), minus tearing down the
        modules, which takes a second with torch loaded and nobody can observe."""
        script = self.argv[0]
        sys.argv = self.argv
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except KeyboardInterrupt:
            sys.excepthook(*sys.exc_info())  # type: ignore[arg-type]
            code = -signal.SIGINT
        except BaseException:
            sys.excepthook(*sys.exc_info())  # type: ignore[arg-type]
            code = 1
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if code == -signal.SIGINT:  # as CPython does: die of the signal, for the parent to see
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def _exit_code(code: object) -> int:
    """The process exit status ``sys.exit(code)`` gives."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _become_child(request: dict[str, Any], fds: list[int], closing: list[socket.socket]) -> Child:
    """In the forked child: drop the server's sockets and handlers, take the caller's
    stdio, environment, folder and process group."""
    for sock in closing:
        sock.close()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if request.get("new_session"):
        os.setsid()
    else:
        os.setpgid(0, 0)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if request["env"].get("PYTHONWARNINGS") == "ignore":
        import warnings

        warnings.simplefilter("ignore")
    return Child(request)


def serve(path: str) -> Child:
    """Serve fork requests on the Unix socket ``path`` until the parent (the test
    process) goes away. Returns only in a forked child, with what the child must run."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "wake")
    children: dict[int, socket.socket] = {}
    owner = os.getppid()
    print("ready", flush=True)
    while True:
        if os.getppid() != owner:  # the test process died: nobody will ask any more
            os._exit(0)
        for key, _ in selector.select(timeout=1.0):
            if key.data == "wake":
                try:
                    while wake_r.recv(4096):
                        pass
                except BlockingIOError:
                    pass
                _reap(children)
            elif key.data == "accept":
                conn, _ = listener.accept()
                conn.setblocking(True)
                msg, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
                request = json.loads(msg.decode())
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    closing = [listener, wake_r, wake_w, conn, *children.values()]
                    return _become_child(request, fds, closing)
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _reap(children)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):  # the caller may have stopped waiting
                conn.sendall(json.dumps({"status": status}).encode() + b"\n")
            conn.close()


def _preload() -> None:
    """What every training script imports: the expensive part of starting one."""
    import numpy  # noqa: F401
    import torch
    import torch.distributed
    import torch.utils.data  # noqa: F401

    import ferry
    import ferry.engine.saveload
    import ferry.session  # noqa: F401


if __name__ == "__main__":
    _preload()
    serve(sys.argv[1]).run()
