"""A task family's own report section: the panels it declares
(:class:`gradscope.tasks.family.ReportSection`), drawn from its variables in accuracy stores. No
family is named here: every registered family with a ``report`` gets its section."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import xarray as xr
from plotly.subplots import make_subplots

from gradscope.store.accuracy import Panel, ReportSection, family_values
from gradscope.store.inputs import Input, at_iteration

from .style import error_arrays, finish, finite_or_none, palette_for

DASHES = ("solid", "dash", "dot", "dashdot", "longdash")


def family_figure(section: ReportSection, stores: list[Input], iteration: int | None = None,
                  palette: dict[str, str] | None = None) -> go.Figure | None:
    """One panel per declared panel: its variable against its ``x`` at the report's checkpoint, one
    line per configuration (colour) and value of ``split`` (dash): the mean over the configuration's
    stores (seeds), with bars from the lowest to the highest seed. None when no store holds them."""
    stores = [s for s in stores if all(v in s.ds for v in section.variables())]
    if not stores:
        return None
    palette = palette_for((s.label for s in stores), palette)
    values = [family_values(s.ds, at_iteration(s.ds, iteration, s.path))[1] for s in stores]  # once per store
    panels = section.panels
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p.title for p in panels])
    shown: set[str] = set()
    for col, panel in enumerate(panels, start=1):
        for label in dict.fromkeys(s.label for s in stores):
            members = [i for i, s in enumerate(stores) if s.label == label]
            group = [stores[i] for i in members]
            seeds = np.stack([np.asarray(values[i][panel.variable], dtype=np.float64) for i in members])
            first = group[0].ds
            x = _ticks(first, panel)
            keep = [k for k, v in enumerate(first[panel.x].values) if panel.x_only is None
                    or str(v).startswith(panel.x_only)]
            x = [x[k] for k in keep]
            splits = [None] if panel.split is None else [str(v) for v in first[panel.split].values]
            for k, split in enumerate(splits):
                line = (seeds if split is None else seeds[:, k])[:, keep]  # (seeds, x)
                mean = line.mean(0)
                low, high = line.min(0), line.max(0)
                if panel.bounds is not None and len(group) == 1:  # its own interval, not a range of one seed
                    low, high = (np.asarray(values[members[0]][b], dtype=np.float64)[keep] for b in panel.bounds)
                name = f"{label} ({len(group)} seed{'s' if len(group) > 1 else ''})" + (f", {split}" if split else "")
                fig.add_trace(go.Scatter(x=x, y=finite_or_none(mean), name=name, legendgroup=name,
                                         showlegend=name not in shown, mode="lines+markers",
                                         line=dict(color=palette[label], dash=DASHES[k % len(DASHES)]),
                                         error_y=error_arrays(mean, low, high)), row=1, col=col)
                shown.add(name)
        fig.update_xaxes(title_text=panel.x_title or panel.x, type="category", row=1, col=col)
        fig.update_yaxes(title_text=panel.y_title, type="log" if panel.log_y else None, row=1, col=col)
    return finish(fig, section.heading, 440, legend="below")


def _ticks(ds: xr.Dataset, panel: Panel) -> list[str]:
    """The labels of ``panel.x``'s values: its coordinate's, or "first–last" of its ``x_ticks`` coordinates."""
    if panel.x_ticks is None:
        return [str(v) for v in ds[panel.x].values]
    a, b = (ds[c].values for c in panel.x_ticks)
    return [f"{p}–{q}" if p != q else str(p) for p, q in zip(a, b)]
