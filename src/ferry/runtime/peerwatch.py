"""Stalled peers: a rank that stops answering (its node SIGSTOPped, hung in the kernel, cut off
from the network) holds every other rank in its next collective until the process group's
timeout (30 minutes by default), without a word. A rank that dies is seen within seconds (its
connections close); a stalled one is not.

So each rank beats on the job's store (a key of its own, rewritten every ``stall/4`` seconds
from a thread of its own, no collective), and the ranks that speak for a node (local rank 0)
read every rank's key: a key that has not changed for ``stall`` seconds, or a store that has
not answered for as long (it lives in node 0's launcher), ends the watching rank with a
message naming the silent rank and its node, so that the launcher, the supervisor and the
scheduler see the job fail instead of wait. The watch starts once every rank has beaten once
(at the ranks' second agreement), and a rank that closes its session says so (``done``): a
rank whose script ended is no stalled one.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("ferry")

DONE = b"done"
PREFIX = "ferry/alive"


def beat_interval(stall: float) -> float:
    """How often a rank beats: four times per ``stall``, at most every 5 s."""
    return max(min(stall / 4, 5.0), 0.02)


class Silence:
    """When each rank was last heard from, as one watcher sees it: pure bookkeeping over the
    values read from the store and the watcher's own clock (ranks' clocks are never compared)."""

    def __init__(self, ranks: list[int], now: float) -> None:
        self.heard: dict[int, tuple[bytes | None, float]] = {r: (None, now) for r in ranks}
        self.store_ok = now

    def resume(self, now: float) -> None:
        """The watcher itself did not run for a while (its node was stopped, or descheduled):
        what it did not see is no peer's silence; every rank is heard from as of now."""
        self.store_ok = now
        self.heard = {rank: (value, now) for rank, (value, _) in self.heard.items()}

    def read(self, values: dict[int, bytes], now: float) -> None:
        self.store_ok = now
        for rank, value in values.items():
            if value == DONE:
                self.heard.pop(rank, None)  # its script ended: not watched any more
            elif rank in self.heard and value != self.heard[rank][0]:
                self.heard[rank] = (value, now)

    def silent(self, stall: float, now: float) -> tuple[int, bytes | None] | None:
        """The rank silent for longer than ``stall`` (the longest silent one), or None;
        rank -1 when the store itself has not answered for that long."""
        if now - self.store_ok > stall:
            return -1, None
        worst = max(self.heard.items(), key=lambda item: now - item[1][1], default=None)
        if worst is not None and now - worst[1][1] > stall:
            return worst[0], worst[1][0]
        return None


def describe(rank: int, value: bytes | None) -> str:
    """``rank R (node N, host H)`` from the rank's last beat."""
    parts = (value or b"").decode(errors="replace").split(" ")
    if len(parts) >= 3:
        return f"rank {rank} (node {parts[2]}, host {parts[1]})"
    return f"rank {rank}"


class PeerWatch:
    """This rank's beat, and (``watch``) its watch over every rank of the job."""

    def __init__(
        self,
        store: Any,
        *,
        rank: int,
        world_size: int,
        node: str,
        stall: float,
        watch: bool,
        on_stall: Callable[[str], None],
        where: str = "",
    ) -> None:
        """``store``: a connection of this rank's own to the job's store; ``node``: this
        rank's node, as the messages name it; ``on_stall``: told why, once, from the watch's
        thread, when a peer is silent (it ends the process); ``where``: the store's address."""
        self.store, self.rank, self.world_size = store, rank, world_size
        self.node, self.stall, self.watch, self.on_stall, self.where = node, stall, watch, on_stall, where
        self.prefix = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._n = 0

    def key(self, rank: int) -> str:
        return f"{self.prefix}/{rank}"

    def beat(self) -> None:
        self._n += 1
        self.store.set(self.key(self.rank), f"{self._n} {socket.gethostname()} {self.node}".encode())

    def begin(self, token: int) -> None:
        """At the ranks' first agreement (``token`` names it on every rank): the first beat."""
        self.prefix = f"{PREFIX}/{token:016x}"
        self.beat()

    def start(self) -> None:
        """At the ranks' second agreement: every rank has beaten once; beat and watch."""
        if self._thread is None and self.prefix:
            self._thread = threading.Thread(target=self._run, name="ferry-peer-watch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        others = [r for r in range(self.world_size) if r != self.rank]
        silence = Silence(others, time.monotonic())
        every = beat_interval(self.stall)
        last = time.monotonic()
        while not self._stop.wait(every):
            if time.monotonic() - last > 2 * every + 1.0:
                silence.resume(time.monotonic())
            last = time.monotonic()
            with contextlib.suppress(Exception):  # a store not answering is seen by the watch
                self.beat()
            if self.watch:
                with contextlib.suppress(Exception):
                    values = self.store.multi_get([self.key(r) for r in others])
                    silence.read(dict(zip(others, values, strict=True)), time.monotonic())
                found = silence.silent(self.stall, time.monotonic())
                if found is not None and not self._stop.is_set():
                    self.on_stall(self._message(*found))
                    return

    def _message(self, rank: int, value: bytes | None) -> str:
        if rank < 0:
            return (
                f"the job's store{self.where} has not answered for {self.stall:g} s: the node that runs "
                "it (node 0's launcher) is stopped, hung or cut off; ending this rank "
                f"(FERRY_STALL_SECONDS={self.stall:g})"
            )
        return (
            f"{describe(rank, value)} has not been heard from for {self.stall:g} s: it is stopped, "
            f"hung or cut off, and the job cannot go on without it; ending this rank "
            f"(FERRY_STALL_SECONDS={self.stall:g})"
        )

    def close(self) -> None:
        """The session ends: this rank is done, not stalled."""
        self._stop.set()
        if self.prefix:
            with contextlib.suppress(Exception):
                self.store.set(self.key(self.rank), DONE)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
