"""The paper's remaining experiments, per output position from accuracy stores: a feedback
model's accuracy self-fed beside ground-truth fed, and an extended vocabulary's accuracy on old beside
new target items (model features, not task families; a family's own figures are its report section:
family_figures.py)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from gradscope.store.inputs import Input, at_iteration

from .style import NUM, error_arrays, finish, finite_or_none, palette_for

# (variable, its second dimension or None, line dash per member of that dimension, y title, title)
KINDS = {
    "decoding": ("decoded_position_accuracy", "decoding", {"autoregressive": "solid", "teacher": "dash"},
                 "token accuracy", "Decoding: self-fed (solid) beside ground-truth fed (dashed) accuracy per position"),
    "item": ("item_position_accuracy", "item", {"old": "solid", "new": "dash"}, "token accuracy",
             "Vocabulary extension: accuracy on old (solid) and new (dashed) target items per position"),
}


def position_figure(kind: str, stores: list[Input], iteration: int | None = None,
                    palette: dict[str, str] | None = None) -> go.Figure | None:
    """One line per configuration (and member of the split, if any): the mean over its stores
    (seeds) per output time, with bars from the lowest to the highest seed."""
    var, dim, dashes, ytitle, title = KINDS[kind]
    stores = [s for s in stores if var in s.ds]
    if not stores:
        return None
    palette = palette_for((s.label for s in stores), palette)
    fig = go.Figure()
    for label in dict.fromkeys(s.label for s in stores):
        group = [s for s in stores if s.label == label]
        members = [str(m) for m in group[0].ds[dim].values] if dim else [""]
        times = group[0].ds["time"].values
        for j, member in enumerate(members):
            rows = []
            for s in group:
                at = s.ds[var].isel(checkpoint=at_iteration(s.ds, iteration, s.path))
                rows.append((at.isel({dim: j}) if dim else at).values.astype(float))
            values = np.stack(rows)
            mean = values.mean(0)
            low, high = values.min(0), values.max(0)
            seeds = f"{len(group)} seed{'s' if len(group) > 1 else ''}"
            name = f"{label}, {member} ({seeds})" if member else f"{label} ({seeds})"
            fig.add_trace(go.Scatter(
                x=times, y=finite_or_none(mean), name=name, mode="lines+markers",
                line=dict(color=palette[label], dash=dashes.get(member, "solid")),
                error_y=error_arrays(mean, low, high),
                hovertemplate=f"{name}<br>time %{{x}}<br>{ytitle} %{{y{NUM}}}<extra></extra>"))
    fig.update_xaxes(title_text="time step (output phase)", tickformat="d")
    if len(times) <= 24:  # whole time steps only
        fig.update_xaxes(tickmode="linear", dtick=1)
    fig.update_yaxes(title_text=ytitle)
    return finish(fig, title, 420)
