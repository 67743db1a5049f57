"""Figures from stability stores: stability over training (Figure 5), distributions, spectra."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gradscope.store.inputs import CONFIDENCE, DEFAULT_SCORE, StabilityPoint

from .style import NUM, WIDTH, finish, finite_or_none, palette_for, rgba, text_px

LAST_CHECKPOINT = "last checkpoint"  # where the per-triplet figures are drawn unless told (their titles say it)
PAIR_SHORT = {"same-target": "same-target pairs", "same-suffix": "same-suffix pairs"}
PAIR_TEXT = {"same-target": "same-target pairs (shared prefix and target)",
             "same-suffix": "same-suffix pairs (shared suffix)"}


def _split(condition: str) -> tuple[str, str]:
    target, _, disturbant = condition.partition("/")
    return target, disturbant or target


def condition_text(condition: str) -> str:
    target, disturbant = _split(condition)
    return f"target {target} · disturbant {disturbant}"


def stability_figure(points: list[StabilityPoint], score: str = DEFAULT_SCORE, confidence: float = CONFIDENCE,
                     palette: dict[str, str] | None = None, details: dict[str, str] | None = None) -> go.Figure:
    """Figure 5 as the paper draws it: mean stability score vs training iteration, one panel per
    condition (rows) and pair kind (columns), one line per configuration with its CI band (over seeds
    where a configuration has several, else over triplets: each point's ``unit``), each configuration
    in its own colour (``palette``: the report's). A configuration of several seeds also has one thin
    dotted line per seed, hidden until its legend entry is clicked. ``details``: label → full label
    for hover text."""
    labels = list(dict.fromkeys(p.label for p in points))
    pairs = list(dict.fromkeys(p.pair for p in points))
    conditions = list(dict.fromkeys(p.condition for p in points))
    palette = palette_for(labels, palette)
    details = details or {}
    fig = make_subplots(rows=len(conditions), cols=len(pairs), shared_xaxes=True, shared_yaxes=True,
                        vertical_spacing=0.25 / max(1, len(conditions)), horizontal_spacing=0.06,
                        subplot_titles=[f"{PAIR_SHORT.get(pair, pair)} · {condition_text(cond)}"
                                        for cond in conditions for pair in pairs])
    shown = set()
    for r, cond in enumerate(conditions, start=1):
        for c, pair in enumerate(pairs, start=1):
            for label in labels:
                pts = sorted((p for p in points if (p.label, p.pair, p.condition) == (label, pair, cond)),
                             key=lambda p: p.iteration)
                if not pts:
                    continue
                x, color = [p.iteration for p in pts], palette[label]
                high, low = finite_or_none(p.interval.high for p in pts), finite_or_none(p.interval.low for p in pts)
                fig.add_trace(go.Scatter(x=x, y=high, mode="lines", line=dict(width=0), showlegend=False,
                                         legendgroup=label, hoverinfo="skip", name=f"{label} upper"), r, c)
                fig.add_trace(go.Scatter(x=x, y=low, mode="lines", line=dict(width=0), fill="tonexty",
                                         fillcolor=rgba(color, 0.18), showlegend=False, legendgroup=label,
                                         hoverinfo="skip", name=f"{label} lower"), r, c)
                fig.add_trace(go.Scatter(
                    x=x, y=finite_or_none(p.interval.mean for p in pts), mode="lines+markers", name=label,
                    legendgroup=label, showlegend=label not in shown, line=dict(color=color, width=2),
                    customdata=[[p.interval.low, p.interval.high, p.interval.n, p.stores,
                                 f" (+{p.interval.nan} NaN, left out)" if p.interval.nan else "",
                                 "seeds (t-interval over their means)" if p.unit == "seed" else "triplets"]
                                for p in pts],
                    hovertemplate=(f"{details.get(label, label)}<br>{pair}, {condition_text(cond)}<br>"
                                   f"iteration %{{x}}<br>mean %{{y{NUM}}} [{confidence:.0%} CI "
                                   f"%{{customdata[0]{NUM}}}, %{{customdata[1]{NUM}}}]<br>n = %{{customdata[2]}} "
                                   f"%{{customdata[5]}}%{{customdata[4]}} from %{{customdata[3]}} "
                                   f"store(s)<extra></extra>")),
                    r, c)
                _seed_lines(fig, pts, label, color, r, c, first=label not in shown)
                shown.add(label)
            fig.update_yaxes(title_text=f"{score} score" if c == 1 else None, row=r, col=c)
            fig.update_xaxes(title_text="training iteration" if r == len(conditions) else None, row=r, col=c)
    units = {p.unit for p in points}
    over = ("seeds as trials: the mean of the seeds' means, with a Student t-interval over seeds"
            if units == {"seed"} else "mean over triplets, seeds pooled, with a bootstrap CI"
            if units == {"triplet"} else "bands over seeds where a configuration has several, else over triplets")
    title = f"Gradient stability over training ({score} score): {over} ({confidence:.0%})"
    fig.update_layout(legend_traceorder="normal")
    return finish(fig, title, 140 + 300 * len(conditions), "configuration")


def _seed_lines(fig: go.Figure, pts: list[StabilityPoint], label: str, color: str, row: int, col: int,
                first: bool) -> None:
    """One thin dotted line per seed of a several-seed configuration, hidden until its legend entry (one
    per configuration and seed) is clicked."""
    if not any(p.unit == "seed" for p in pts):
        return
    seeds = sorted({s for p in pts for s, _ in p.per_seed})
    for s in seeds:
        xs = [p.iteration for p in pts if any(k == s for k, _ in p.per_seed)]
        ys = [next(v for k, v in p.per_seed if k == s) for p in pts if any(k == s for k, _ in p.per_seed)]
        name = f"{label} · seed {s}"
        fig.add_trace(go.Scatter(x=xs, y=finite_or_none(ys), mode="lines", name=name, legendgroup=name,
                                 showlegend=first, visible="legendonly", line=dict(color=color, width=1, dash="dot"),
                                 hovertemplate=(f"{label}, seed {s}<br>iteration %{{x}}<br>mean over triplets "
                                                f"%{{y{NUM}}}<extra></extra>")), row, col)


def distribution_figure(samples: dict[str, dict[tuple[str, str], np.ndarray]], score: str = DEFAULT_SCORE,
                        where: str = LAST_CHECKPOINT, palette: dict[str, str] | None = None,
                        details: dict[str, str] | None = None) -> go.Figure:
    """Box plots of per-triplet scores per condition (x), one box per configuration (colour:
    vanilla vs PE), one column per pair (same-target, same-suffix)."""
    labels = list(samples)
    pairs = list(dict.fromkeys(pair for s in samples.values() for pair, _ in s))
    conditions = list(dict.fromkeys(cond for s in samples.values() for _, cond in s))
    palette = palette_for(labels, palette)
    fig = make_subplots(rows=1, cols=len(pairs), shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=[PAIR_TEXT.get(p, p) for p in pairs])
    per_category = (WIDTH - 400) / max(1, len(pairs)) / max(1, len(conditions))  # px, beside a legend
    narrow = max(map(text_px, conditions), default=0) > 0.8 * per_category  # then break labels at '/'
    for c, pair in enumerate(pairs, start=1):
        for label in labels:
            xs, ys, ns = [], [], []
            for cond in conditions:
                values = samples[label].get((pair, cond), np.array([]))
                xs += [cond] * values.size
                ys += list(values)
                nan = int(values.size - np.isfinite(values).sum())
                ns += [f"{int(np.isfinite(values).sum())}" + (f" (+{nan} NaN, left out)" if nan else "")] * values.size
            fig.add_trace(go.Box(
                x=xs, y=finite_or_none(ys), name=label, legendgroup=label, showlegend=c == 1,
                marker=dict(color=palette[label], size=3), boxpoints="all", jitter=0.4, pointpos=0, boxmean=True,
                # box hover lists the exact quartiles/mean; each point's hover its value and n
                text=[f"{(details or {}).get(label, label)}, {pair}: n = {n} triplets" for n in ns],
                hoverinfo="x+y+text"), 1, c)
        fig.update_xaxes(title_text="condition (target / disturbant group)", row=1, col=c, tickmode="array",
                         tickvals=conditions, ticktext=[cond.replace("/", " /<br>") if narrow else cond
                                                        for cond in conditions])
    fig.update_yaxes(title_text=f"{score} score per triplet", row=1, col=1)
    fig.update_layout(boxmode="group")
    return finish(fig, f"Stability per triplet at the {where} ({score} score; seeds pooled; box: quartiles, "
                       f"dashed: mean)", 480, "configuration")


def spectra_figure(spectra: dict[str, dict[str, tuple[np.ndarray, int]]], where: str = LAST_CHECKPOINT,
                   palette: dict[str, str] | None = None, details: dict[str, str] | None = None) -> go.Figure:
    """Mean singular values σ_k of the Jacobians ∂h_2L/∂z_p vs k, log y: one panel per condition,
    one line per configuration (colour: vanilla vs PE)."""
    labels = list(spectra)
    conditions = list(dict.fromkeys(cond for s in spectra.values() for cond in s))
    cols = min(2, len(conditions))
    rows = math.ceil(len(conditions) / cols)
    palette = palette_for(labels, palette)
    fig = make_subplots(rows=rows, cols=cols, shared_xaxes=True, shared_yaxes=True, vertical_spacing=0.14,
                        horizontal_spacing=0.06, subplot_titles=[condition_text(c) for c in conditions])
    for i, cond in enumerate(conditions):
        r, c = divmod(i, cols)
        for label in labels:
            if cond not in spectra[label]:
                continue
            sv, n = spectra[label][cond]
            fig.add_trace(go.Scatter(
                x=list(range(1, sv.size + 1)), y=finite_or_none(sv), mode="lines+markers", name=label,
                legendgroup=label, showlegend=i == 0, line=dict(color=palette[label]), marker=dict(size=4),
                hovertemplate=(f"{(details or {}).get(label, label)}<br>{condition_text(cond)}<br>σ_%{{x}} mean "
                               f"%{{y{NUM}}}<br>"
                               f"n = {n} Jacobians<extra></extra>")), r + 1, c + 1)
        fig.update_yaxes(type="log", exponentformat="power", dtick=1, row=r + 1, col=c + 1,  # no 2, 5 labels
                         title_text="mean singular value σ_k" if c == 0 else None)
        fig.update_xaxes(title_text="singular value index k" if r == rows - 1 else None, row=r + 1, col=c + 1)
    return finish(fig, f"Singular-value spectra of ∂h_2L/∂z_p at the {where} (mean over triplets and the three "
                       f"members, seeds pooled)", 140 + 300 * rows, "configuration")
