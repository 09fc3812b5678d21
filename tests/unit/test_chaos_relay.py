"""The relay behind `ferry chaos`'s remote-down fault, on real loopback sockets: bytes pass
both ways, ``down()`` resets open connections and refuses new ones, ``up()`` listens on the
same port again."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from ferry.chaos.remote import Relay


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A server that answers every line with the same line."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()
    stop.set()
    thread.join()
    server.close()


def roundtrip(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += conn.recv(65536)
        return got


def test_relay_passes_bytes_goes_down_and_comes_back_on_its_port(echo: tuple[str, int]) -> None:
    relay = Relay(echo)
    port = relay.port
    payload = bytes(range(256)) * 1000  # more than one recv's worth
    assert roundtrip(port, payload) == payload

    held = socket.create_connection(("127.0.0.1", port), timeout=5)
    held.sendall(b"ping")
    assert held.recv(4) == b"ping"
    relay.down()
    assert not relay.is_up
    try:  # the open connection was cut: reset, or at least closed
        data = held.recv(4)
    except TimeoutError:
        pytest.fail("down() left an open connection alive")
    except OSError:
        data = b""
    assert data == b""
    held.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)

    relay.up()
    assert relay.port == port and relay.is_up
    assert roundtrip(port, b"back") == b"back"
    relay.down()
