"""Language-model figures (issue #27): test perplexity by token-frequency decile and by position bin,
from lm accuracy stores (variables freq_perplexity and pos_perplexity)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gradscope.store.inputs import Input, at_iteration

from .style import error_arrays, finish, finite_or_none, palette_for


def lm_figure(stores: list[Input], iteration: int | None = None,
              palette: dict[str, str] | None = None) -> go.Figure | None:
    """Two panels: perplexity by frequency decile (1 = the most frequent tenth of the token types)
    and by target-position bin. One line per configuration: the mean over its stores (seeds), with
    bars from the lowest to the highest seed."""
    stores = [s for s in stores if "freq_perplexity" in s.ds and "pos_perplexity" in s.ds]
    if not stores:
        return None
    palette = palette_for((s.label for s in stores), palette)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("by token-frequency decile (train counts)",
                                                        "by target position in the paragraph"))
    for label in dict.fromkeys(s.label for s in stores):
        group = [s for s in stores if s.label == label]
        freq, pos = [], []
        for s in group:
            k = at_iteration(s.ds, iteration, s.path)
            bins = [str(b) for b in s.ds["freq_bin"].values]
            deciles = [i for i, b in enumerate(bins) if b.startswith("decile")]
            freq.append(s.ds["freq_perplexity"].isel(checkpoint=k).values[deciles])
            pos.append(s.ds["pos_perplexity"].isel(checkpoint=k).values)
        ticks = [f"{a}–{b}" if a != b else str(a) for a, b in zip(group[0].ds["pos_start"].values,
                                                                     group[0].ds["pos_end"].values)]
        name = f"{label} ({len(group)} seed{'s' if len(group) > 1 else ''})"
        for col, values, x in ((1, np.stack(freq), list(range(1, 11))), (2, np.stack(pos), ticks)):
            mean = values.mean(0)
            fig.add_trace(go.Scatter(x=x, y=finite_or_none(mean), name=name, legendgroup=label, showlegend=col == 1,
                                     mode="lines+markers", line=dict(color=palette[label]),
                                     error_y=error_arrays(mean, values.min(0), values.max(0))), row=1, col=col)
    fig.update_yaxes(type="log", title_text="test perplexity")
    fig.update_xaxes(title_text="frequency decile", row=1, col=1)
    fig.update_xaxes(title_text="positions", row=1, col=2)
    return finish(fig, "Language model: test perplexity by token frequency and by position", 420)
