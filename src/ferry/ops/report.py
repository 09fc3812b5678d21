"""A job's life as a picture: training steps over wall time, checkpoints and their
durations, interruptions, migrations and the work lost to failures.

The data comes from ``events.jsonl`` and ``status.json`` (docs/jobs.md). Steps are known
at checkpoints, stops, resumes and the last status, so the step curve joins those points.
The HTML page is self-contained (inline SVG); the PNG is drawn here, with no plotting
library, and carries no text: the page has the labels and the numbers.
"""

from __future__ import annotations

import html
import itertools
import struct
import zlib
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from ferry.knobs import CHECKPOINT_EXIT_CODE
from ferry.runtime.jobfiles import Event, Status

W, H, PAD = 900, 380, 50
COLORS = {
    "curve": (31, 119, 180),
    "checkpoint": (44, 160, 44),
    "stop": (255, 127, 14),
    "failure": (214, 39, 40),
    "migration": (148, 103, 189),
    "axis": (90, 90, 90),
}


class Mark(TypedDict):
    """A vertical marker."""

    kind: Literal["stop", "failure", "migration"]
    time: float
    text: str


class Saved(TypedDict):
    """A checkpoint, from its event."""

    step: int
    time: float
    seconds: float
    blocking_seconds: float
    url: str | None


Box = tuple[float, float, float, float]
Shape = tuple[Literal["line", "rect"], Box, tuple[int, int, int]]


@dataclass
class Timeline:
    job: str
    segments: list[list[tuple[float, int]]] = field(default_factory=list)
    """(time, step) points of each worker's life."""
    checkpoints: list[Saved] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    lost_seconds: float = 0.0
    start: float = 0.0
    end: float = 1.0

    @property
    def max_step(self) -> int:
        return max([1, *(s for seg in self.segments for _, s in seg)])


def build(job_id: str, events: list[Event], status: Status) -> Timeline:
    tl = Timeline(job_id)
    current: list[tuple[float, int]] = []
    last_ckpt_time: float | None = None
    for e in sorted(events, key=lambda e: e["time"]):
        t, kind = e["time"], e["event"]
        step = e.get("step")
        if kind in ("run_start", "worker_start"):
            if current:
                tl.segments.append(current)
            current = [(t, 0)] if kind == "worker_start" and not tl.checkpoints else []
        if isinstance(step, int) and kind in ("checkpoint", "resume", "stop"):
            current.append((t, step))
        if kind == "checkpoint" and isinstance(step, int):
            saved: Saved = {
                "step": step,
                "time": t,
                "seconds": e.get("seconds", 0.0),
                "blocking_seconds": e.get("blocking_seconds", 0.0),
                "url": e.get("url"),
            }
            tl.checkpoints.append(saved)
            last_ckpt_time = t
        elif kind == "stop":
            tl.marks.append({"kind": "stop", "time": t, "text": f"stopped at step {step} (checkpointed)"})
        elif (
            kind == "worker_exit"
            and e.get("returncode") not in (0, CHECKPOINT_EXIT_CODE)
            and e.get("returncode") is not None
        ):
            lost = t - last_ckpt_time if last_ckpt_time is not None else 0.0
            tl.lost_seconds += lost
            tl.marks.append(
                {
                    "kind": "failure",
                    "time": t,
                    "text": f"worker exited {e.get('returncode')}: {lost:.1f} s of work since the last "
                    "checkpoint lost and recomputed",
                }
            )
        elif kind == "restart" and e.get("reason") == "requested":
            env = " ".join(f"{k}={v}" for k, v in e.get("env", {}).items())
            tl.marks.append(
                {
                    "kind": "migration",
                    "time": t,
                    "text": f"restarted in place {env} "
                    f"(down {e.get('downtime_seconds', 0.0):.2f} s until the new worker started)",
                }
            )
    if "updated" in status and "step" in status:
        current.append((status["updated"], status["step"]))
    if current:
        tl.segments.append(current)
    times = [e["time"] for e in events] + [t for seg in tl.segments for t, _ in seg]
    if times:
        tl.start, tl.end = min(times), max(max(times), min(times) + 1e-3)
    return tl


def hexcolor(rgb: tuple[int, int, int]) -> str:
    return "#" + "".join(f"{c:02x}" for c in rgb)


def _xy(tl: Timeline, t: float, step: float) -> tuple[float, float]:
    x = PAD + (t - tl.start) / (tl.end - tl.start) * (W - 2 * PAD)
    y = H - PAD - step / tl.max_step * (H - 2 * PAD)
    return x, y


def _shapes(tl: Timeline) -> list[Shape]:
    """Primitives both renderers draw: ("line", (x0, y0, x1, y1)) and ("rect", (x0, y0, x1, y1))."""
    out: list[Shape] = []
    out.append(("line", (PAD, H - PAD, W - PAD, H - PAD), COLORS["axis"]))
    out.append(("line", (PAD, PAD, PAD, H - PAD), COLORS["axis"]))
    for m in tl.marks:
        x, _ = _xy(tl, m["time"], 0)
        out.append(("line", (x, PAD, x, H - PAD), COLORS[m["kind"]]))
    for seg in tl.segments:
        pts = sorted(seg)
        for (t0, s0), (t1, s1) in itertools.pairwise(pts):
            out.append(("line", (*_xy(tl, t0, s0), *_xy(tl, t1, s1)), COLORS["curve"]))
    for c in tl.checkpoints:
        t, secs = c["time"], c["seconds"]
        x0, y = _xy(tl, t - secs, c["step"])
        x1, _ = _xy(tl, t, 0)
        out.append(("rect", (x0, y - 4, max(x1, x0 + 2), y + 4), COLORS["checkpoint"]))
    return out


def svg(tl: Timeline) -> str:
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">']
    for kind, (x0, y0, x1, y1), rgb in _shapes(tl):
        color = hexcolor(rgb)
        if kind == "line":
            parts.append(
                f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y1:.1f}" '
                f'stroke="{color}" stroke-width="2"/>'
            )
        else:
            parts.append(
                f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0:.1f}" '
                f'height="{y1 - y0:.1f}" fill="{color}"/>'
            )
    parts.append(f'<text x="{PAD}" y="{PAD - 10}" font-size="12">step (max {tl.max_step})</text>')
    span = tl.end - tl.start
    parts.append(f'<text x="{W - PAD}" y="{H - 15}" font-size="12" text-anchor="end">{span:.1f} s</text>')
    parts.append(f'<text x="{PAD}" y="{H - 15}" font-size="12">0 s (wall time)</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def png(tl: Timeline) -> bytes:
    pixels = bytearray(b"\xff" * (W * H * 3))

    def put(x: int, y: int, rgb: tuple[int, int, int]) -> None:
        if 0 <= x < W and 0 <= y < H:
            i = (y * W + x) * 3
            pixels[i : i + 3] = bytes(rgb)

    for kind, (x0, y0, x1, y1), rgb in _shapes(tl):
        if kind == "rect":
            for y in range(int(y0), int(y1) + 1):
                for x in range(int(x0), int(x1) + 1):
                    put(x, y, rgb)
            continue
        n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        for i in range(n + 1):
            px, py = int(x0 + (x1 - x0) * i / n), int(y0 + (y1 - y0) * i / n)
            put(px, py, rgb)
            put(px + 1, py, rgb)
    raw = b"".join(b"\x00" + bytes(pixels[y * W * 3 : (y + 1) * W * 3]) for y in range(H))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def page(tl: Timeline, status: Status) -> str:
    esc = html.escape
    rows = "".join(
        f"<tr><td>{c['step']}</td><td>{c['time'] - tl.start:.1f}</td>"
        f"<td>{c['seconds']:.3f}</td><td>{c['blocking_seconds']:.3f}</td>"
        f"<td>{esc(str(c['url']))}</td></tr>"
        for c in tl.checkpoints
    )
    marks = "".join(
        f'<li style="color:{hexcolor(COLORS[m["kind"]])}">{m["time"] - tl.start:.1f} s: {esc(m["text"])}</li>'
        for m in tl.marks
    )
    saves = [c["seconds"] for c in tl.checkpoints]
    mean = f"{sum(saves) / len(saves):.3f} s" if saves else "-"
    legend = ", ".join(
        f'<span style="color:{hexcolor(rgb)}">{k}</span>' for k, rgb in COLORS.items() if k != "axis"
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>ferry job {esc(tl.job)}</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:2px 8px;text-align:right}}</style>
</head><body>
<h1>ferry job {esc(tl.job)}</h1>
<p>state <b>{esc(str(status.get("state")))}</b> at step {status.get("step")}; wall time
{tl.end - tl.start:.1f} s; {len(tl.checkpoints)} checkpoints (mean save {mean});
{sum(m["kind"] == "failure" for m in tl.marks)} failures, {sum(m["kind"] == "stop" for m in tl.marks)}
stops, {sum(m["kind"] == "migration" for m in tl.marks)} migrations; work lost and recomputed:
{tl.lost_seconds:.1f} s of wall time.</p>
<p>Legend: {legend}. The step curve joins the steps known at checkpoints, stops, resumes
and the last status; a checkpoint is a bar as long as its save.</p>
{svg(tl)}
<h2>Events</h2><ul>{marks or "<li>no interruption</li>"}</ul>
<h2>Checkpoints</h2>
<table><tr><th>step</th><th>at (s)</th><th>save (s)</th><th>blocked (s)</th><th>url</th></tr>{rows}</table>
</body></html>
"""
