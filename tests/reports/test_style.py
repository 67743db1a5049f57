"""The layout rules every figure is finished with: subplot titles fit their panels (the full text on
hover), the legend sits outside them, and axis titles are given once per row and column."""

from __future__ import annotations

import plotly.graph_objects as go

from gradscope.reports.style import finish


def test_layout_rules_fit_titles_to_their_panels() -> None:
    """A subplot title longer than its panel is wrapped and cut (full text on hover); the legend is
    outside the panels."""
    from plotly.subplots import make_subplots
    long = "GRU vanilla [max_len=128, checkpoint_every=5000, iterations=60000] · same-target pairs · rare/rare"
    fig = make_subplots(rows=1, cols=4, subplot_titles=[long] * 4)
    for c in range(1, 5):
        fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], name=f"line {c}"), 1, c)
    fig = finish(fig, "title", 400, "legend")
    for ann in fig.layout.annotations:
        assert ann.text != long and ann.hovertext == long and ann.text.count("<br>") <= 1
        assert max(map(len, ann.text.split("<br>"))) * 0.55 * 13 <= (1100 - 80) / 4
    assert fig.layout.legend.x >= 1.0 and fig.layout.legend.xanchor == "left"


def test_layout_rules_give_axis_titles_once_per_row_and_column() -> None:
    from plotly.subplots import make_subplots
    fig = make_subplots(rows=2, cols=3)
    for r in (1, 2):
        for c in (1, 2, 3):
            fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], showlegend=False), r, c)
    fig.update_xaxes(title_text="iteration")
    fig.update_yaxes(title_text="score")
    fig = finish(fig, "title", 500)
    titled = {name: fig.layout[name].title.text for name in fig.layout if name[1:5] == "axis" and
              fig.layout[name].title.text}
    assert titled == {"yaxis": "score", "yaxis4": "score", "xaxis4": "iteration", "xaxis5": "iteration",
                      "xaxis6": "iteration"}
