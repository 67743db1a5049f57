"""Figures from dynamics stores (docs/definitions.md §7): gradient flow against distance, the (t, T) heatmap, step
spectral radii, Lyapunov spectra and their convergence, gate terms — each over checkpoints."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gradscope.store.dynamics import FlowCurve

from .style import NUM, finish, finite_or_none, group_color, palette_for, rgba

CLASS_COLORS = {"frequent": group_color("frequent"), "rare": group_color("rare"), "query": "#7f7f7f"}


def _opacity(i: int, n: int) -> float:
    """Later checkpoints darker: 0.35 … 1."""
    return 1.0 if n <= 1 else 0.35 + 0.65 * i / (n - 1)


def flow_figure(curves: list[FlowCurve]) -> go.Figure:
    """log10 ‖∂y_T/∂z_k‖_F against T − k, one panel per configuration, one line per token class and
    checkpoint (later checkpoints darker), with 95% t-interval bands over sequences."""
    labels = list(dict.fromkeys(c.label for c in curves))
    fig = make_subplots(rows=1, cols=len(labels), shared_yaxes=True, subplot_titles=labels, horizontal_spacing=0.04)
    for col, label in enumerate(labels, start=1):
        mine = [c for c in curves if c.label == label]
        iterations = sorted({c.iteration for c in mine})
        for c in sorted(mine, key=lambda c: (c.iteration, c.token_class)):
            color = CLASS_COLORS.get(c.token_class, "#7f7f7f")
            alpha = _opacity(iterations.index(c.iteration), len(iterations))
            name = f"{c.token_class} · it {c.iteration}"
            fig.add_trace(go.Scatter(x=c.distance, y=finite_or_none(c.high), mode="lines", line=dict(width=0),
                                     showlegend=False, hoverinfo="skip", legendgroup=name), 1, col)
            fig.add_trace(go.Scatter(x=c.distance, y=finite_or_none(c.low), mode="lines", line=dict(width=0),
                                     fill="tonexty", fillcolor=rgba(color, 0.12 * alpha), showlegend=False,
                                     hoverinfo="skip", legendgroup=name), 1, col)
            fig.add_trace(go.Scatter(
                x=c.distance, y=finite_or_none(c.mean), mode="lines+markers", name=name, legendgroup=name,
                showlegend=col == 1, opacity=alpha, line=dict(color=color, width=2), marker=dict(size=4),
                hovertemplate=(f"{label}<br>{c.token_class} tokens, iteration {c.iteration}<br>T − k = %{{x}}"
                               f"<br>log10 |dy_T/dz_k| = %{{y{NUM}}}<br>n = {c.n} sequences<extra></extra>")), 1, col)
    fig.update_xaxes(title_text="distance T − k (steps)")
    fig.update_yaxes(title_text="log10 ‖∂y_T/∂z_k‖_F", col=1)
    return finish(fig, "Gradient flow: where the backward signal vanishes or explodes", 460, "token read at step k")


def grid_figure(grids: list[tuple[str, int, np.ndarray]]) -> go.Figure:
    """Mean log10 ‖∂z_T/∂z_t‖_F over the grid sequences: one heatmap per configuration × checkpoint."""
    titles = [f"{label} · it {it}" for label, it, _ in grids]
    cols = min(4, len(grids))
    rows = -(-len(grids) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.05,
                        vertical_spacing=0.12 / rows + 0.05)
    finite = np.concatenate([g[np.isfinite(g)].ravel() for _, _, g in grids]) if grids else np.array([0.0])
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    for i, (label, it, g) in enumerate(grids):
        n = g.shape[0]
        fig.add_trace(go.Heatmap(z=[finite_or_none(row) for row in g], x=np.arange(1, n + 1), y=np.arange(1, n + 1),
                                 zmin=lo, zmax=hi, colorscale="Viridis", showscale=i == 0,
                                 colorbar=dict(title=dict(text="log10", side="right")), name=f"{label} · it {it}",
                                 hovertemplate="t = %{y}, T = %{x}<br>log10 |dz_T/dz_t| = %{z:.3f}<extra></extra>"),
                      i // cols + 1, i % cols + 1)
    fig.update_yaxes(autorange="reversed")
    for c in range(1, cols + 1):  # axis titles once per column and once per row, not on every panel
        fig.update_xaxes(title_text="T (later step)", row=rows, col=c)
    for r in range(1, rows + 1):
        fig.update_yaxes(title_text="t (earlier step)", row=r, col=1)
    return finish(fig, "The (t, T) grid of ‖∂z_T/∂z_t‖_F", 360 * rows + 80)


def radius_figure(samples: dict[str, dict[int, dict[str, np.ndarray]]]) -> go.Figure:
    """Histograms of the step spectral radius ρ(J_t) by the class of the token read, per configuration;
    one trace per checkpoint (later darker)."""
    labels = list(samples)
    fig = make_subplots(rows=1, cols=len(labels), shared_yaxes=True, subplot_titles=labels, horizontal_spacing=0.04)
    for col, label in enumerate(labels, start=1):
        iterations = sorted(samples[label])
        for i, it in enumerate(iterations):
            for k, values in samples[label][it].items():
                fig.add_trace(go.Histogram(x=values, name=f"{k} · it {it}", legendgroup=f"{k} · it {it}",
                                           showlegend=col == 1, opacity=0.25 + 0.5 * _opacity(i, len(iterations)),
                                           marker_color=CLASS_COLORS.get(k, "#7f7f7f"), histnorm="probability",
                                           nbinsx=40), 1, col)
    fig.update_layout(barmode="overlay")
    fig.add_vline(x=1.0, line=dict(color="black", dash="dot", width=1))
    fig.update_xaxes(title_text="spectral radius ρ(J_t)")
    fig.update_yaxes(title_text="share of steps", col=1)
    return finish(fig, "Step-Jacobian spectral radius by the token read", 420, "token · checkpoint")


def lyapunov_figure(spectra: list[tuple[str, int, tuple]], convergence: list[tuple[str, int, np.ndarray, np.ndarray]],
                    palette: dict[str, str] | None = None,
                    errors: list[tuple[str, int, np.ndarray | None, np.ndarray | None]] | None = None) -> go.Figure:
    """Left: the Lyapunov spectrum λ_i (index i) with 95% t-intervals over trajectories, per
    configuration and checkpoint, and (stores with error bars) a band of ±2 batch-means standard
    errors. Right: the running estimate of λ_1 and λ_D against steps, with ±2 standard errors over
    trajectories where the store has them."""
    bars = {(label, it): (batch, running) for label, it, batch, running in (errors or [])}
    fig = make_subplots(rows=1, cols=2, subplot_titles=["Lyapunov spectrum (natural log per step)",
                                                        "convergence of λ_1 (solid) and λ_D (dotted)"],
                        horizontal_spacing=0.08)
    labels = list(dict.fromkeys(label for label, _, _ in spectra))
    color = palette_for(labels, palette)
    its = {label: sorted({it for l2, it, _ in spectra if l2 == label}) for label in labels}
    for label, it, (mean, low, high, n) in spectra:
        alpha = _opacity(its[label].index(it), len(its[label]))
        idx = np.arange(1, mean.size + 1)
        name = f"{label} · it {it}"
        fig.add_trace(go.Scatter(x=idx, y=finite_or_none(mean), mode="lines", name=name, legendgroup=name,
                                 opacity=alpha, line=dict(color=color[label], width=2),
                                 error_y=dict(type="data", symmetric=False, array=finite_or_none(high - mean),
                                              arrayminus=finite_or_none(mean - low), thickness=0.8, width=0),
                                 hovertemplate=(f"{name}<br>λ_%{{x}} = %{{y{NUM}}}<br>n = {n} trajectories"
                                                "<extra></extra>")), 1, 1)
        batch = bars.get((label, it), (None, None))[0]
        if batch is not None and np.isfinite(batch).any():
            _band(fig, idx, mean, 2 * batch, color[label], alpha, name, "±2 SE (batch means)", 1)
    for label, it, steps, running in convergence:
        alpha = _opacity(its.get(label, [it]).index(it) if it in its.get(label, []) else 0, len(its.get(label, [it])))
        name = f"{label} · it {it}"
        running_se = bars.get((label, it), (None, None))[1]
        for j, dash in ((0, "solid"), (running.shape[1] - 1, "dot")):
            if running_se is not None and np.isfinite(running_se[:, j]).any():
                _band(fig, steps, running[:, j], 2 * running_se[:, j], color.get(label), alpha, name,
                      f"λ_{j + 1} ±2 SE (trajectories)", 2)
            fig.add_trace(go.Scatter(x=steps, y=finite_or_none(running[:, j]), mode="lines", legendgroup=name,
                                     showlegend=False, opacity=alpha, line=dict(color=color.get(label), dash=dash),
                                     name=f"{name} λ_{j + 1}",
                                     hovertemplate=f"{name}<br>step %{{x}}: λ_{j + 1} ≈ %{{y{NUM}}}<extra></extra>"),
                          1, 2)
    fig.add_hline(y=0.0, line=dict(color="black", width=1, dash="dot"))
    fig.update_xaxes(title_text="exponent index i", col=1)
    if convergence:  # a little room before the first step, so its tick label clears the y axis's
        lo = min(float(np.min(steps)) for _, _, steps, _ in convergence)
        hi = max(float(np.max(steps)) for _, _, steps, _ in convergence)
        fig.update_xaxes(range=[lo - 0.05 * (hi - lo), hi + 0.02 * (hi - lo)], col=2)
    fig.update_xaxes(title_text="steps after warm-up", col=2)
    fig.update_yaxes(title_text="λ (per step)", col=1)
    return finish(fig, "Lyapunov spectra (Benettin/QR)", 460, "configuration · checkpoint")


def _band(fig: go.Figure, x: np.ndarray, centre: np.ndarray, half: np.ndarray, color: str | None, alpha: float,
          group: str, what: str, col: int) -> None:
    """A shaded band centre ± half (NaN/inf points left as gaps) in the legend group of its line."""
    ok = np.isfinite(centre) & np.isfinite(half)
    xs, lo, hi = np.asarray(x)[ok], (centre - half)[ok], (centre + half)[ok]
    if not xs.size:
        return
    fig.add_trace(go.Scatter(x=np.concatenate([xs, xs[::-1]]), y=np.concatenate([hi, lo[::-1]]), fill="toself",
                             mode="none", fillcolor=color, opacity=0.18 * alpha, legendgroup=group, showlegend=False,
                             name=f"{group} {what}", hoverinfo="skip"), 1, col)


def gate_figure(means: list[tuple[str, int, str, dict[str, float]]]) -> go.Figure:
    """Mean ‖term‖_F of each gate term of J_t after frequent, rare and query tokens: one panel per
    configuration, grouped bars per gate, one bar per token class and checkpoint."""
    labels = list(dict.fromkeys(m[0] for m in means))
    fig = make_subplots(rows=1, cols=len(labels), shared_yaxes=True, subplot_titles=labels, horizontal_spacing=0.04)
    for col, label in enumerate(labels, start=1):
        mine = [m for m in means if m[0] == label]
        iterations = sorted({m[1] for m in mine})
        for _, it, k, values in mine:
            name = f"{k} · it {it}"
            fig.add_trace(go.Bar(x=list(values), y=finite_or_none(values.values()), name=name, legendgroup=name,
                                 showlegend=col == 1, marker_color=CLASS_COLORS.get(k, "#7f7f7f"),
                                 opacity=_opacity(iterations.index(it), len(iterations)),
                                 hovertemplate=f"{label}<br>{name}<br>%{{x}}: %{{y{NUM}}}<extra></extra>"), 1, col)
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="path through the cell")
    fig.update_yaxes(title_text="mean ‖term‖_F", col=1)
    return finish(fig, "Which gate carries the gradient: the terms of J_t", 440, "token read · checkpoint")
