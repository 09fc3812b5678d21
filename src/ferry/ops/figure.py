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


def time_unit(span: float) -> tuple[str, float]:
    """The unit the wall-time axis reads best in for a job of ``span`` seconds: a job of
    hours in hours, not in ticks of 20000 s."""
    if span >= 3 * 3600:
        return "h", 3600.0
    if span >= 3 * 60:
        return "min", 60.0
    return "s", 1.0


def draw(tl: Timeline) -> Figure:
    """The figure; times are since the job's first event, in ``time_unit``'s unit."""
    # Figure, not pyplot: no global state, no GUI backend; canvases attach at save time.
    fig = _figure_class()(figsize=(11, 4.8), layout="constrained")
    ax = fig.add_subplot()
    unit, per = time_unit(tl.end - tl.start)

    def at(t: float) -> float:
        return (t - tl.start) / per

    seen: set[str] = set()
    for span in tl.down:
        ax.axvspan(at(span["start"]), at(span["end"]), color=COLORS["down"], alpha=0.35, lw=0,
                   label=label("not training: worker exiting or down", seen))  # fmt: skip
    for span in tl.startups:
        ax.axvspan(at(span["start"]), at(span["end"]), color=COLORS["startup"], alpha=0.3, lw=0,
                   label=label("worker start-up (start, imports, restore)", seen))  # fmt: skip
    for span in tl.overlaps:
        ax.axvspan(at(span["start"]), at(span["end"]), color=COLORS["overlap"], alpha=0.25, lw=0,
                   hatch="..", label=label("warm worker start-up, beside training", seen))  # fmt: skip
    lost = f"work lost (recomputed): {tl.lost_seconds:.1f} s"  # in all: a short span is a sliver
    for span in tl.lost:
        ax.axvspan(at(span["start"]), at(span["end"]), color=COLORS["failure"], alpha=0.25, lw=0,
                   hatch="//", label=label(lost, seen))  # fmt: skip
    for seg in tl.segments:
        pts = sorted(seg)
        tail = pts[-2:] if len(pts) >= 2 and pts[-1] == tl.last_status and pts[-2][1] != pts[-1][1] else []
        known = pts[:-1] if tail else pts
        ax.plot([at(t) for t, _ in known], [s for _, s in known], color=COLORS["curve"], lw=2,
                label=label("training step", seen))  # fmt: skip
        if tail:  # the step of the last status: when it was reached in between is not recorded
            ax.plot([at(t) for t, _ in tail], [s for _, s in tail], color=COLORS["curve"], lw=1.5, ls=":",
                    label=label("last status (steps in between not recorded)", seen))  # fmt: skip
    for c in tl.checkpoints:
        x = at(c["time"])
        kind, name = (
            ("deleted", "checkpoint (deleted by retention)") if c["deleted"] else ("checkpoint", "checkpoint")
        )
        ax.hlines(c["step"], x - c["seconds"] / per, x, color=COLORS[kind], lw=4, alpha=0.6)
        ax.plot([x], [c["step"]], "o" if not c["deleted"] else "x", color=COLORS[kind], ms=7,
                mfc=COLORS[kind] if not c["deleted"] else "none", label=label(name, seen))  # fmt: skip
    styles: dict[str, dict[str, Any]] = {
        "stop": {"ls": "--", "name": "stop (checkpointed)"},
        "resume": {"ls": ":", "name": "resume (the job run again)"},
        "failure": {"ls": "-", "name": "failure"},
        "migration": {"ls": "-.", "name": "migration (restarted in place)"},
    }
    for m in tl.marks:
        style = styles[m["kind"]]
        ax.axvline(
            at(m["time"]), color=COLORS[m["kind"]], ls=style["ls"], lw=1.5, label=label(style["name"], seen)
        )
    ax.set_xlim(0, at(tl.end) * 1.02)
    ax.set_ylim(0, tl.max_step * 1.08)
    ax.set_xlabel(f"wall time since the job started ({unit})")
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
