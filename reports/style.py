"""Colours, line styles and small helpers shared by the figure builders."""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import plotly.graph_objects as go

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
GROUP_COLORS = {"frequent": "#1f77b4", "rare": "#d62728", "all": "#2ca02c"}  # target group → colour
GROUP_DASH = {"frequent": "solid", "rare": "dash", "all": "dot"}  # disturbant group → line style
FONT = dict(family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif", size=13)
NUM = ":.6g"  # hover number format: six significant digits


def colors(labels: Iterable[str]) -> dict[str, str]:
    """A fixed colour per label, in first-seen order (vanilla labels sort first so they get blue)."""
    ordered = sorted(dict.fromkeys(labels), key=lambda s: ("vanilla" not in s, s))
    return {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(ordered)}


def group_color(group: str) -> str:
    return GROUP_COLORS.get(group, "#7f7f7f")


def group_dash(group: str) -> str:
    return GROUP_DASH.get(group, "dashdot")


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


def finish(fig: go.Figure, title: str, height: int, legend_title: str = "") -> go.Figure:
    """Common layout: white template, title, legend on the right, given height."""
    fig.update_layout(template="plotly_white", title=dict(text=title, x=0.0, xanchor="left"), height=height,
                      font=FONT, legend=dict(title=dict(text=legend_title), groupclick="toggleitem"),
                      margin=dict(l=70, r=20, t=90, b=60), hoverlabel=dict(namelength=-1))
    return fig
