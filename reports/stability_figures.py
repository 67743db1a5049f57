"""Figures from stability stores: stability over training (Figure 5), distributions, spectra."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gradscope.store.inputs import StabilityPoint

from .style import NUM, colors, finish, finite_or_none, group_color, group_dash, rgba

PAIR_TEXT = {"same-target": "same-target pairs (shared prefix and target)",
             "same-suffix": "same-suffix pairs (shared suffix)"}


def _split(condition: str) -> tuple[str, str]:
    target, _, disturbant = condition.partition("/")
    return target, disturbant or target


def condition_text(condition: str) -> str:
    target, disturbant = _split(condition)
    return f"target {target} · disturbant {disturbant}"


def stability_figure(points: list[StabilityPoint], score: str = "default", confidence: float = 0.95) -> go.Figure:
    """Mean stability score vs training iteration with a CI band: one row per configuration (the
    legend groups them: vanilla vs PE), one column per pair; colour = target group, line style =
    disturbant group."""
    labels = list(dict.fromkeys(p.label for p in points))
    pairs = list(dict.fromkeys(p.pair for p in points))
    fig = make_subplots(rows=len(labels), cols=len(pairs), shared_xaxes=True, shared_yaxes=True,
                        vertical_spacing=0.12 / max(1, len(labels)) + 0.04, horizontal_spacing=0.05,
                        subplot_titles=[f"{label} · {pair}" for label in labels for pair in pairs])
    for r, label in enumerate(labels, start=1):
        for c, pair in enumerate(pairs, start=1):
            conditions = list(dict.fromkeys(p.condition for p in points if p.label == label and p.pair == pair))
            for cond in conditions:
                pts = sorted((p for p in points if (p.label, p.pair, p.condition) == (label, pair, cond)),
                             key=lambda p: p.iteration)
                x = [p.iteration for p in pts]
                target, disturbant = _split(cond)
                color = group_color(target)
                high, low = finite_or_none(p.interval.high for p in pts), finite_or_none(p.interval.low for p in pts)
                fig.add_trace(go.Scatter(x=x, y=high, mode="lines", line=dict(width=0), showlegend=False,
                                         legendgroup=label, hoverinfo="skip", name=f"{cond} upper"), r, c)
                fig.add_trace(go.Scatter(x=x, y=low, mode="lines", line=dict(width=0), fill="tonexty",
                                         fillcolor=rgba(color, 0.15), showlegend=False, legendgroup=label,
                                         hoverinfo="skip", name=f"{cond} lower"), r, c)
                fig.add_trace(go.Scatter(
                    x=x, y=finite_or_none(p.interval.mean for p in pts), mode="lines+markers",
                    name=condition_text(cond), legendgroup=label, legendgrouptitle_text=label,
                    showlegend=c == 1, line=dict(color=color, dash=group_dash(disturbant), width=2),
                    customdata=[[p.interval.low, p.interval.high, p.interval.n, p.stores,
                                 f" (+{p.interval.nan} NaN, left out)" if p.interval.nan else ""] for p in pts],
                    hovertemplate=(f"{label}<br>{pair}, {condition_text(cond)}<br>iteration %{{x}}<br>"
                                   f"mean %{{y{NUM}}} [{confidence:.0%} CI %{{customdata[0]{NUM}}}, "
                                   f"%{{customdata[1]{NUM}}}]<br>n = %{{customdata[2]}} triplets%{{customdata[4]}} "
                                   f"from %{{customdata[3]}} store(s)<extra></extra>")), r, c)
            fig.update_yaxes(title_text=f"{score} score (dimensionless)" if c == 1 else None, row=r, col=c)
            fig.update_xaxes(title_text="training iteration" if r == len(labels) else None, row=r, col=c)
    title = (f"Gradient stability over training ({score} score): mean over triplets, seeds pooled, "
             f"with {confidence:.0%} bootstrap CI")
    fig.update_layout(legend_traceorder="grouped")  # fill="tonexty" would reverse it
    return finish(fig, title, 120 + 300 * len(labels), "configuration · condition")


def distribution_figure(samples: dict[str, dict[tuple[str, str], np.ndarray]], score: str = "default",
                        where: str = "last checkpoint") -> go.Figure:
    """Box plots of per-triplet scores per condition (x), one box per configuration (colour:
    vanilla vs PE), one column per pair (same-target, same-suffix)."""
    labels = list(samples)
    pairs = list(dict.fromkeys(pair for s in samples.values() for pair, _ in s))
    conditions = list(dict.fromkeys(cond for s in samples.values() for _, cond in s))
    palette = colors(labels)
    fig = make_subplots(rows=1, cols=len(pairs), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=[PAIR_TEXT.get(p, p) for p in pairs])
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
                text=[f"{label}, {pair}: n = {n} triplets" for n in ns], hoverinfo="x+y+text"), 1, c)
        fig.update_xaxes(title_text="condition (target group / disturbant group)", row=1, col=c)
    fig.update_yaxes(title_text=f"{score} score per triplet (dimensionless)", row=1, col=1)
    fig.update_layout(boxmode="group")
    return finish(fig, f"Stability per triplet at the {where} ({score} score; seeds pooled; box: quartiles, "
                       f"dashed: mean)", 480, "configuration")


def spectra_figure(spectra: dict[str, dict[str, tuple[np.ndarray, int]]], where: str = "last checkpoint") -> go.Figure:
    """Mean singular values σ_k of the Jacobians ∂h_2L/∂z_p vs k, log y: one panel per condition,
    one line per configuration (colour: vanilla vs PE)."""
    labels = list(spectra)
    conditions = list(dict.fromkeys(cond for s in spectra.values() for cond in s))
    cols = min(2, len(conditions))
    rows = math.ceil(len(conditions) / cols)
    palette = colors(labels)
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
                hovertemplate=(f"{label}<br>{condition_text(cond)}<br>σ_%{{x}} mean %{{y{NUM}}}<br>"
                               f"n = {n} Jacobians<extra></extra>")), r + 1, c + 1)
        fig.update_yaxes(type="log", exponentformat="power", row=r + 1, col=c + 1,
                         title_text="mean singular value σ_k (dimensionless)" if c == 0 else None)
        fig.update_xaxes(title_text="singular value index k" if r == rows - 1 else None, row=r + 1, col=c + 1)
    return finish(fig, f"Singular-value spectra of ∂h_2L/∂z_p at the {where} (mean over triplets and the three "
                       f"members, seeds pooled)", 140 + 300 * rows, "configuration")
