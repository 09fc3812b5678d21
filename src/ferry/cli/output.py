"""Human tables and ``--json`` output, shared by every command."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import click

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, its end marked with an ellipsis (``...``, which
    every terminal's encoding has) when it was cut."""
    return text if len(text) <= width else text[: width - 3] + "..."


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def ago(seconds: float) -> str:
    """How long ago, for people: "3 s ago", "5 min ago", "2 h ago", "4 d ago". Ages come from
    epoch seconds on both sides (never from a local-time parse), so every time zone agrees;
    a time slightly ahead (clocks of two hosts) reads as "just now"."""
    if seconds < 1:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def clock(epoch: float | None) -> str:
    """A moment in local time, short: "14:03:07" today, "11-20 14:03" before."""
    if epoch is None:
        return "-"
    at = time.localtime(epoch)
    if time.strftime("%Y-%m-%d", at) == time.strftime("%Y-%m-%d"):
        return time.strftime("%H:%M:%S", at)
    return time.strftime("%m-%d %H:%M", at)
