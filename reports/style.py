"""Colours, line styles and small helpers shared by the figure builders."""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import plotly.graph_objects as go

# D3's category20 without its reds (red marks Rare): the dark tones first, then their light ones, so up to
# 16 configurations get distinct colours (the shipped samples alone are 12 runs).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
           "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#9edae5", "#dbdb8d")
GROUP_COLORS = {"frequent": "#1f77b4", "rare": "#d62728", "all": "#2ca02c"}  # target group → colour
FONT = dict(family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif", size=13)
NUM = ":.6g"  # hover number format: six significant digits


def colors(labels: Iterable[str], first: Iterable[str] = ()) -> dict[str, str]:
    """A fixed colour per label from one qualitative palette, in first-seen order; labels in ``first``
    (the configurations of the central figure) take the first colours. Build it once per report and
    pass it to every figure, so a configuration has one colour throughout."""
    ordered = list(dict.fromkeys([*first, *labels]))
    return {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(ordered)}


def palette_for(labels: Iterable[str], palette: dict[str, str] | None) -> dict[str, str]:
    """``palette`` (the report's) extended to any label it lacks; a fresh one when None."""
    labels = list(dict.fromkeys(labels))
    if palette is None:
        return colors(labels)
    extra = [label for label in labels if label not in palette]
    used = set(palette.values())
    spare = [c for c in PALETTE if c not in used] or list(PALETTE)
    return {**palette, **{label: spare[i % len(spare)] for i, label in enumerate(extra)}}


def group_color(group: str) -> str:
    return GROUP_COLORS.get(group, "#7f7f7f")


def rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def finite_or_none(values: Iterable[float]) -> list[float | None]:
    """Plain floats, NaN/inf as None (a gap in the plot, valid JSON)."""
    return [float(v) if v is not None and math.isfinite(float(v)) else None for v in values]


def error_arrays(mean: np.ndarray, low: np.ndarray, high: np.ndarray) -> dict[str, Any]:
    """Asymmetric error bars for plotly: high − mean above, mean − low below."""
    mean, low, high = (np.asarray(a, dtype=np.float64) for a in (mean, low, high))
    return dict(type="data", symmetric=False, array=finite_or_none(high - mean),
                arrayminus=finite_or_none(mean - low), thickness=1.2, width=4)


# --- layout rules ----------------------------------------------------------------------------------
# Figures have a fixed width, so that text can be fitted to it before the browser draws anything:
# subplot and axis titles are wrapped (then cut, with the full text on hover) to their panel, the
# figure title to the figure, the legend sits beside or below the panels, and the figure is tall
# enough that the legend never scrolls.

WIDTH = 1100  # px: every figure (the page is 1200 px at most; static export uses the same)
CHAR = 0.55  # average glyph width in em of the report font, ~10% above that measured in Chromium (DejaVu Sans)
TITLE_SIZE = 16
TOOLBAR = 260  # px at the top right kept clear of the title: plotly's mode bar
LINE = 1.3  # line height in em


def text_px(text: str, size: float = FONT["size"]) -> float:
    """Estimated rendered width of one line of plain text (no tags)."""
    return len(text) * CHAR * size


def wrap(text: str, px: float, size: float = FONT["size"], lines: int = 2) -> str:
    """``text`` broken at spaces into at most ``lines`` lines of at most ``px``; the last line is
    cut with '…' if it is still too long. Existing '<br>' breaks are kept."""
    limit = max(4, int(px / (CHAR * size)))
    out: list[str] = []
    for para in text.split("<br>"):
        line = ""
        for word in para.split(" "):
            if line and len(line) + 1 + len(word) > limit:
                out.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        out.append(line)
    if len(out) > lines:
        out = out[:lines - 1] + [" ".join(out[lines - 1:])]
    return "<br>".join(o if len(o) <= limit else o[:limit - 1].rstrip() + "…" for o in out)


NO_LEGEND = ("heatmap",)  # trace types plotly leaves out of the legend unless told otherwise


def _in_legend(trace: Any) -> bool:
    shown = trace.showlegend if trace.showlegend is not None else trace.type not in NO_LEGEND
    return bool(shown and trace.name)


def _legend_px(fig: go.Figure) -> tuple[float, float]:
    """Estimated (width, height) of the legend beside the panels: entries, group titles, legend title."""
    names = [str(t.name) for t in fig.data if _in_legend(t)]
    groups = {str(t.legendgrouptitle.text) for t in fig.data if _in_legend(t) and t.legendgrouptitle.text}
    title = fig.layout.legend.title.text or ""
    if not names:
        return 0.0, 0.0
    width = max([text_px(n) + 45 for n in names] + [text_px(g) + 10 for g in groups] + [text_px(title) + 10])
    height = 27 * (len(names) + len(groups) + bool(title)) + 14 * len(groups) + 20  # bar entries are ~26 px
    return width, height


def _legend_entries(fig: go.Figure) -> int:
    return sum(map(_in_legend, fig.data))


def _panels(fig: go.Figure, axis: str) -> dict[str, tuple[float, float]]:
    """Domains of every x or y axis of the figure: {'x', 'x2', …: (start, end)} in paper units."""
    out = {}
    for name in fig.layout:
        if name.startswith(f"{axis}axis"):
            ax = fig.layout[name]
            out[axis + name[5:]] = tuple(ax.domain) if ax.domain else (0.0, 1.0)
    return out


def _one_title_per_row_and_column(fig: go.Figure) -> None:
    """Repeated axis titles go: a y title is kept only on the leftmost panel of its row, an x title
    only on the bottom panel of its column (panels side by side or stacked share them)."""
    for axis, other in (("y", "x"), ("x", "y")):
        seen: dict[tuple, tuple[float, str]] = {}
        for name in list(fig.layout):
            if not name.startswith(f"{axis}axis"):
                continue
            ax = fig.layout[name]
            if not (ax.title and ax.title.text):
                continue
            anchor = fig.layout[f"{other}axis{str(ax.anchor or other)[1:]}"] if ax.anchor != "free" else None
            where = float(anchor.domain[0]) if anchor is not None and anchor.domain else 0.0
            key = (tuple(ax.domain or (0.0, 1.0)), str(ax.title.text))
            if key in seen:
                first_where, first_name = seen[key]
                drop = name if where >= first_where else first_name
                fig.layout[drop].title.text = None
                if drop == first_name:
                    seen[key] = (where, name)
            else:
                seen[key] = (where, name)


def _fit_subplot_titles(fig: go.Figure, plot_w: float) -> int:
    """Wrap each subplot title to its panel's width (the full text on hover when cut); returns the
    most lines a title takes."""
    centres = {round((a + b) / 2, 6): b - a for a, b in _panels(fig, "x").values()}
    lines = 0
    for ann in fig.layout.annotations or ():
        if ann.xref == "paper" and ann.yref == "paper" and ann.yanchor == "bottom" and ann.text:
            full = str(ann.text)
            ann.text = wrap(full, centres.get(round(float(ann.x), 6), 1.0) * plot_w - 8)
            if ann.text != full:
                ann.hovertext = full
            lines = max(lines, ann.text.count("<br>") + 1)
    return lines


def _fit_axis_titles(fig: go.Figure, plot_w: float, plot_h: float) -> None:
    """Wrap each axis title to its panel's width (x) or height (y)."""
    domains = {"x": _panels(fig, "x"), "y": _panels(fig, "y")}
    for name in list(fig.layout):
        ax = fig.layout[name]
        if name.startswith(("xaxis", "yaxis")) and ax.title and ax.title.text:
            a, b = domains[name[0]].get(name[0] + name[5:], (0.0, 1.0))
            ax.title.text = wrap(str(ax.title.text), (b - a) * (plot_w if name[0] == "x" else plot_h) - 8)


def finish(fig: go.Figure, title: str, height: int, legend_title: str = "", legend: str = "beside") -> go.Figure:
    """Common layout and the layout rules: white template, fixed width, wrapped title (clear of the
    plot's toolbar), legend beside or below the panels (never over them), subplot and axis titles
    fitted to their panels. ``legend``: 'beside', 'below' (a grid of entries under the x-axis
    titles) or 'none'."""
    size = FONT["size"]
    _one_title_per_row_and_column(fig)
    fig.update_layout(legend=dict(title=dict(text=legend_title), groupclick="toggleitem"))
    legend_w, legend_h = _legend_px(fig) if legend != "none" else (0.0, 0.0)
    margin_l, margin_r, margin_b = 80, (legend_w + 30 if legend_w and legend == "beside" else 30), 70
    plot_w = WIDTH - margin_l - margin_r
    legend_layout = dict(x=1.02, xanchor="left", y=1.0, yanchor="top", orientation="v")
    if legend == "below" and legend_w:
        entry = legend_w - 10
        per_row = max(1, int((WIDTH - 40) // entry))
        rows = -(-_legend_entries(fig) // per_row)
        legend_layout = dict(orientation="h", x=0.0, xanchor="left", xref="container", y=0.0, yanchor="bottom",
                             yref="container", entrywidth=entry, entrywidthmode="pixels", title_side="top")
        margin_b += int(rows * 22 + 30)
        legend_h = 0.0
    title_text = wrap(title, WIDTH - TOOLBAR - 20, TITLE_SIZE, lines=3)
    title_h = (title_text.count("<br>") + 1) * TITLE_SIZE * LINE
    sub_lines = _fit_subplot_titles(fig, plot_w)
    top = 10 + title_h + 12 + sub_lines * size * LINE + 8
    height = int(max(height, top + legend_h + margin_b))
    _fit_axis_titles(fig, plot_w, height - top - margin_b)
    fig.update_layout(template="plotly_white", font=FONT, width=WIDTH, height=height, autosize=False,
                      title=dict(text=title_text, x=0.0, xanchor="left", xref="container", yref="container",
                                 y=1 - (10 + title_h / 2) / height, yanchor="middle", pad=dict(l=10),
                                 font=dict(size=TITLE_SIZE)),
                      legend=legend_layout, showlegend=legend != "none",
                      margin=dict(l=margin_l, r=margin_r, t=int(top), b=margin_b, autoexpand=True),
                      hoverlabel=dict(namelength=-1))
    return fig
