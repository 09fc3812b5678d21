"""Helper of test_save_progress.py: trains a 32 MiB state with ferry's explicit API until it
is stopped. While the file ``--hold`` exists, the write of a checkpoint's data file holds
after its first 16 MiB chunk: a save that lasts as long as the test wants, with half its
bytes written, and no race against the wall clock."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch

import ferry
from ferry.storage.local import LocalStorage

parser = argparse.ArgumentParser()
parser.add_argument("--hold", required=True)
args = parser.parse_args()
_open_writer = LocalStorage.open_writer


class Held:
    """A writer whose second and later chunks wait while the hold file exists."""

    def __init__(self, writer: Any) -> None:
        self.writer, self.chunks = writer, 0

    def write(self, chunk: memoryview) -> None:
        give_up = time.monotonic() + 300  # a test that failed never releases it
        while self.chunks and os.path.exists(args.hold) and time.monotonic() < give_up:
            time.sleep(0.02)
        self.chunks += 1
        self.writer.write(chunk)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.writer, name)


def open_writer(self: LocalStorage, rel: str) -> Any:
    writer = _open_writer(self, rel)
    return Held(writer) if rel.endswith("data-0.bin") else writer


LocalStorage.open_writer = open_writer  # type: ignore[method-assign]
state = {"w": torch.zeros(8 << 20)}  # 32 MiB: two chunks of the data file
ferry.track(state=state)
for _ in range(30000):  # a bound: a test that failed never stops it
    state["w"] += 1
    time.sleep(0.02)
    ferry.step()
