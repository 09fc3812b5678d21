"""The report's figure, drawn with matplotlib (the optional ``report`` extra): training steps
over wall time, with a title, labelled axes and a legend for every kind of mark, so that
the PNG reads without the page beside it. The page embeds the same figure as SVG."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from ferry.errors import ConfigError
from ferry.ops.report import COLORS, Timeline

if TYPE_CHECKING:
    from matplotlib.figure import Figure

INSTALL = "pip install 'gpuferry[report]'"


def _figure_class() -> type[Figure]:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError(f"ferry report draws with matplotlib, which is not installed: {INSTALL}") from None
    return Figure


def label(name: str, seen: set[str]) -> str:
    """``name`` the first time, so that the legend has one entry per kind of mark."""
    if name in seen:
        return "_nolegend_"
    seen.add(name)
    return name


def draw(tl: Timeline) -> Figure:
    """The figure; times are seconds since the job's first event."""
    # Figure, not pyplot: no global state, no GUI backend; canvases attach at save time.
    fig = _figure_class()(figsize=(11, 4.8), layout="constrained")
    ax = fig.add_subplot()
    t0 = tl.start

    seen: set[str] = set()
    for span in tl.startups:
        ax.axvspan(span["start"] - t0, span["end"] - t0, color=COLORS["startup"], alpha=0.3, lw=0,
                   label=label("worker start-up (start, imports, restore)", seen))  # fmt: skip
    for span in tl.overlaps:
        ax.axvspan(span["start"] - t0, span["end"] - t0, color=COLORS["overlap"], alpha=0.25, lw=0,
                   hatch="..", label=label("warm worker start-up, beside training", seen))  # fmt: skip
    for span in tl.lost:
        ax.axvspan(span["start"] - t0, span["end"] - t0, color=COLORS["failure"], alpha=0.25, lw=0,
                   hatch="//", label=label("work lost (recomputed)", seen))  # fmt: skip
    for seg in tl.segments:
        pts = sorted(seg)
        ax.plot([t - t0 for t, _ in pts], [s for _, s in pts], color=COLORS["curve"], lw=2,
                label=label("training step", seen))  # fmt: skip
    for c in tl.checkpoints:
        x = c["time"] - t0
        kind, name = (
            ("deleted", "checkpoint (deleted by retention)") if c["deleted"] else ("checkpoint", "checkpoint")
        )
        ax.hlines(c["step"], x - c["seconds"], x, color=COLORS[kind], lw=4, alpha=0.6)
        ax.plot([x], [c["step"]], "o" if not c["deleted"] else "x", color=COLORS[kind], ms=7,
                mfc=COLORS[kind] if not c["deleted"] else "none", label=label(name, seen))  # fmt: skip
    styles: dict[str, dict[str, Any]] = {
        "stop": {"ls": "--", "name": "stop (checkpointed)"},
        "failure": {"ls": "-", "name": "failure"},
        "migration": {"ls": "-.", "name": "migration / restart"},
    }
    for m in tl.marks:
        style = styles[m["kind"]]
        ax.axvline(
            m["time"] - t0, color=COLORS[m["kind"]], ls=style["ls"], lw=1.5, label=label(style["name"], seen)
        )
    ax.set_xlim(0, (tl.end - t0) * 1.02)
    ax.set_ylim(0, tl.max_step * 1.08)
    ax.set_xlabel("wall time since the job started (s)")
    ax.set_ylabel("training step")
    ax.set_title(f"ferry job {tl.job}: training steps over wall time")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")  # outside: hides no data
    return fig


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def svg(fig: Figure) -> str:
    """The figure as an inline ``<svg>`` element (no XML prolog, no doctype)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: searchable, smaller
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg") :]
