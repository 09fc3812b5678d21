"""The live progress line of long copies (ferry/progress.py): what it draws, that it is
drawn only on a terminal and not with --json, and that a checkpoint copy reports every byte
to it. Through a real pseudo-terminal: tests/integration/test_progress.py."""

from __future__ import annotations

import io
from pathlib import Path

import torch

from ferry.engine import save
from ferry.engine.transfer import TransferPolicy, copy_checkpoint
from ferry.progress import TerminalMeter, meter_for
from ferry.storage import open_storage


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class Recording:
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def start(self, what: str, total: int, elapsed: float = 0.0) -> None:
        self.calls.append(("start", total))

    def advance(self, nbytes: int) -> None:
        self.calls.append(("advance", nbytes))

    def finish(self) -> None:
        self.calls.append(("finish", None))


def test_drawn_only_on_a_terminal_without_json() -> None:
    assert meter_for(False, io.StringIO()) is None
    assert meter_for(True, Tty()) is None
    assert isinstance(meter_for(False, Tty()), TerminalMeter)


def test_the_line_says_bytes_percent_throughput_and_time_left() -> None:
    out = Tty()
    meter = TerminalMeter(out)
    meter.start("copying step-1", 4 << 20)
    assert out.getvalue() == "\rferry: copying step-1: 0.0 MiB of 4.0 MiB, 0%\x1b[K"
    meter.done = 1 << 20
    line = meter.line(meter._t0 + 2.0)
    assert line == "ferry: copying step-1: 1.0 MiB of 4.0 MiB, 25%, 0.5 MiB/s, 6 s left"
    meter.advance(3 << 20)
    meter.finish()
    last = out.getvalue().rsplit("\r", 1)[1]
    assert last.startswith("ferry: copying step-1: 4.0 MiB of 4.0 MiB, 100%, ") and last.endswith(
        "/s\x1b[K\n"
    )


def test_a_checkpoint_copy_reports_every_byte(tmp_path: Path) -> None:
    info = save({"w": torch.zeros(3 << 18), "b": torch.ones(7)}, str(tmp_path / "remote"), step=4)
    meter = Recording()
    name = info.url.rsplit("/", 1)[1]
    remote, local = open_storage(str(tmp_path / "remote")), open_storage(str(tmp_path / "local"))
    copy_checkpoint(remote, name, local, TransferPolicy(remote=remote.url), meter=meter)
    (kind, total), *middle, last = meter.calls
    assert kind == "start" and last == ("finish", None)
    copied = [p for p in (tmp_path / "local" / name).iterdir() if p.name != "manifest.json"]
    assert total == sum(p.stat().st_size for p in copied) > 3 << 20
    assert sum(int(n) for _, n in middle) == total  # type: ignore[call-overload]
