"""Figures from summary and accuracy stores (Figures 2 and 3) and from run logs (training curves).

Each builder returns None when its input lacks the data it plots.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import xarray as xr
from plotly.subplots import make_subplots

from gradscope.store.inputs import core_label, Input, at_iteration, field_name, model_label, pe_label

from .style import NUM, colors, error_arrays, finish, finite_or_none, palette_for

GRID_METRIC = re.compile(r"^grid/([^/]+)/([^/]+)/bin(\d+)$")
GROUP_ORDER = ("frequent", "rare", "all")


def group_fields(ds: xr.Dataset) -> list[str]:
    """The grouping fields of a summary store (its ``by`` attribute, else its group coordinates)."""
    if "by" in ds.attrs:
        by = ds.attrs["by"]
        return list(json.loads(by) if isinstance(by, str) else by)
    return [str(k) for k, v in ds.coords.items() if v.dims == ("group",) and k not in ("group", "label")]


def group_label(ds: xr.Dataset, g: int, skip: tuple[str, ...] = ()) -> str:
    """'GRU vanilla', plus the other grouping fields (minus ``skip``), for summary group ``g``."""
    fields = {f: str(ds[f].values[g]) for f in group_fields(ds)}
    core = fields.pop("core", None) if "core" not in skip else None
    parts = []
    if "pe" in fields:
        pe = fields.pop("pe")
        parts.append(model_label({"core": core, "pe": pe}) if core else pe_label(pe))
    elif core:
        parts.append(core_label(core))
    parts += [f"{field_name(k)}={v}" for k, v in fields.items() if k not in skip]
    return ", ".join(parts) or str(ds["label"].values[g])


def _seeds(ds: xr.Dataset, g: int) -> str:
    if "seed" not in ds:
        return ""
    seeds = [int(s) for s in np.atleast_1d(ds["seed"].values[g]) if s >= 0]
    return f" (seeds {', '.join(map(str, seeds))})" if seeds else ""


def _nan_text(ds: xr.Dataset, g: int, metric: str) -> str:
    """What was NaN behind a summary value: trials, and units (triplets, sequences) of the trials,
    left out and counted (docs/definitions.md §4: never averaged in silently); '' when nothing was."""
    trials = int(ds["nan"].sel(metric=metric).values[g]) if "nan" in ds else 0
    units = int(ds["nan_units"].sel(metric=metric).values[g]) if "nan_units" in ds else 0
    parts = [f"{trials} trial(s)"] * bool(trials) + [f"{units} unit(s) within trials"] * bool(units)
    return f"<br>NaN, left out: {', '.join(parts)}" if parts else ""


def _hover(what: str, ds: xr.Dataset, x_name: str) -> str:
    conf = float(ds.attrs.get("confidence", 0.95))
    unit = str(ds.attrs.get("unit", "trial"))
    return (f"%{{fullData.name}}<br>{x_name}<br>{what} %{{y{NUM}}} [{conf:.0%} CI %{{customdata[0]{NUM}}}, "
            f"%{{customdata[1]{NUM}}}]<br>n = %{{customdata[2]}} ({unit}s)%{{customdata[3]}}%{{customdata[4]}}"
            f"<extra></extra>")


def vocab_figure(ds: xr.Dataset, metric: str = "token_accuracy") -> go.Figure | None:
    """Figure 2: held-out token accuracy vs vocabulary size K with CI error bars; one panel per core,
    one line per PE kind (and any other grouping field)."""
    fields = group_fields(ds)
    if "vocab_size" not in fields or metric not in set(map(str, ds["metric"].values)):
        return None
    cores = list(dict.fromkeys(str(c) for c in ds["core"].values)) if "core" in fields else [""]
    lines: dict[str, list[int]] = {}
    for g in range(ds.sizes["group"]):
        lines.setdefault(group_label(ds, g, skip=("core", "vocab_size")), []).append(g)
    palette = colors(lines)
    fig = make_subplots(rows=1, cols=len(cores), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=[core_label(c) for c in cores] if cores != [""] else None)
    row = ds.sel(metric=metric)
    sizes = sorted({int(v) for v in ds["vocab_size"].values})
    shown: set[str] = set()  # a legend entry at a line's first panel (a PE line may miss the first core)
    for c, core in enumerate(cores, start=1):
        for name, groups in lines.items():
            groups = [g for g in groups if not core or str(ds["core"].values[g]) == core]
            groups.sort(key=lambda g: int(ds["vocab_size"].values[g]))
            if not groups:
                continue
            mean, low, high = (row[v].values[groups] for v in ("mean", "low", "high"))
            fig.add_trace(go.Scatter(
                x=[int(ds["vocab_size"].values[g]) for g in groups], y=finite_or_none(mean), mode="lines+markers",
                name=name, legendgroup=name, showlegend=name not in shown, line=dict(color=palette[name]),
                error_y=error_arrays(mean, low, high),
                customdata=[[low[i], high[i], int(row["n"].values[g]), _seeds(ds, g), _nan_text(ds, g, metric)]
                            for i, g in enumerate(groups)],
                hovertemplate=_hover(metric.replace("_", " "), ds, "K = %{x}")), 1, c)
            shown.add(name)
        fig.update_xaxes(type="log", tickvals=sizes, title_text="vocabulary size K (tokens, log scale)", row=1, col=c)
    fig.update_yaxes(title_text=f"{metric.replace('_', ' ')} (fraction of scored tokens)", row=1, col=1)
    return finish(fig, f"Held-out {metric.replace('_', ' ')} vs vocabulary size, vanilla vs positional encoding "
                       f"(mean over trials, {float(ds.attrs.get('confidence', 0.95)):.0%} bootstrap CI)",
                  460, "positional encoding")


@dataclass(frozen=True)
class GridLine:
    """One line of the frequency grid: accuracy per bin in one (target group, disturbant group) cell."""

    name: str
    color: str
    target: str
    disturbant: str
    bins: list[int]
    mean: np.ndarray
    low: np.ndarray | None
    high: np.ndarray | None
    n: list[int]
    note: str = ""
    nans: list[str] | None = None  # per bin: what was NaN behind the value (summary stores)


def _grid_figure(lines: list[GridLine], title: str, hover: str, ticks: dict[int, str] | None) -> go.Figure:
    targets = [g for g in GROUP_ORDER if any(ln.target == g for ln in lines)]
    disturbants = [g for g in GROUP_ORDER if any(ln.disturbant == g for ln in lines)]
    fig = make_subplots(rows=len(targets), cols=len(disturbants), shared_xaxes=True, shared_yaxes=True,
                        vertical_spacing=0.12, horizontal_spacing=0.05,
                        subplot_titles=[f"target {t} · disturbant {d}" for t in targets for d in disturbants])
    seen = set()
    for ln in lines:
        r, c = targets.index(ln.target) + 1, disturbants.index(ln.disturbant) + 1
        low = ln.low if ln.low is not None else np.full(len(ln.bins), np.nan)
        high = ln.high if ln.high is not None else np.full(len(ln.bins), np.nan)
        fig.add_trace(go.Scatter(
            x=ln.bins, y=finite_or_none(ln.mean), mode="lines+markers", name=ln.name, legendgroup=ln.name,
            showlegend=ln.name not in seen, line=dict(color=ln.color),
            error_y=error_arrays(ln.mean, low, high) if ln.low is not None else None,
            customdata=[[low[i], high[i], ln.n[i], ln.note, ln.nans[i] if ln.nans else ""]
                        for i in range(len(ln.bins))],
            hovertemplate=hover), r, c)
        seen.add(ln.name)
    for r in range(1, len(targets) + 1):
        fig.update_yaxes(title_text="accuracy (fraction of targets)", row=r, col=1)
    for c in range(1, len(disturbants) + 1):
        axis = dict(title_text="target-position bin (index)")
        if ticks:
            axis.update(title_text="target positions in the bin (1-based, inclusive)", tickvals=list(ticks),
                        ticktext=list(ticks.values()))
        fig.update_xaxes(**axis, row=len(targets), col=c)
    return finish(fig, title, 160 + 300 * len(targets), "configuration")


def grid_figure_summary(ds: xr.Dataset) -> go.Figure | None:
    """Figure 3 from a summary store: metrics grid/<tg>/<dg>/bin<k>, mean with CI error bars."""
    cells: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for name in map(str, ds["metric"].values):
        m = GRID_METRIC.match(name)
        if m:
            cells.setdefault((m.group(1), m.group(2)), []).append((int(m.group(3)), name))
    if not cells:
        return None
    labels = [group_label(ds, g) for g in range(ds.sizes["group"])]
    palette = colors(labels)
    lines = []
    for (tg, dg), metrics in cells.items():
        metrics.sort()
        sel = ds.sel(metric=[name for _, name in metrics])
        for g, label in enumerate(labels):
            lines.append(GridLine(label, palette[label], tg, dg, [k for k, _ in metrics], sel["mean"].values[g],
                                  sel["low"].values[g], sel["high"].values[g],
                                  [int(v) for v in sel["n"].values[g]], _seeds(ds, g),
                                  [_nan_text(ds, g, name) for _, name in metrics]))
    conf = float(ds.attrs.get("confidence", 0.95))
    return _grid_figure(lines, f"Accuracy by target-position bin in the frequency grid (mean over trials, "
                               f"{conf:.0%} bootstrap CI)", _hover("accuracy", ds, "bin %{x}"), None)


def grid_figure_accuracy(stores: list[Input], iteration: int | None = None,
                         palette: dict[str, str] | None = None) -> go.Figure | None:
    """Figure 3 from accuracy stores (no CIs): grid_bin_accuracy at one checkpoint, one line per store."""
    stores = [s for s in stores if "grid_bin_accuracy" in s.ds]
    if not stores:
        return None
    palette = palette_for((s.label for s in stores), palette)
    lines, ticks = [], {}
    for s in stores:
        ds = s.ds
        k = at_iteration(ds, iteration, s.path)
        acc = ds["grid_bin_accuracy"].isel(checkpoint=k)
        bins = [int(b) + 1 for b in ds["bin"].values]
        if "bin_start" in ds:
            ticks.update({b: f"{a}–{e}" for b, a, e in zip(bins, ds["bin_start"].values, ds["bin_end"].values)})
        name = f"{s.label}, seed {s.seed}" if s.seed is not None else s.label
        note = f" sequences; {s.path.name} at iteration {int(ds['iteration'].values[k])}"
        for tg in map(str, ds["target_group"].values):
            for dg in map(str, ds["disturbant_group"].values):
                n = [int(v) for v in ds["grid_n"].sel(target_group=tg, disturbant_group=dg).values] \
                    if "grid_n" in ds else [0] * len(bins)
                lines.append(GridLine(name, palette[s.label], tg, dg, bins,
                                      acc.sel(target_group=tg, disturbant_group=dg).values, None, None, n, note))
    hover = (f"%{{fullData.name}}<br>bin %{{x}}<br>accuracy %{{y{NUM}}}<br>n = %{{customdata[2]}}"
             f"%{{customdata[3]}}<extra></extra>")
    return _grid_figure(lines, "Accuracy by target-position bin in the frequency grid (single trials, no CI)",
                        hover, ticks or None)


LOG_SPAN = 3.0  # training lengths differing by more than this factor get a log iteration axis


def training_figure(runs: list[Input], palette: dict[str, str] | None = None,
                    log_x: bool | None = None) -> go.Figure | None:
    """Training loss (top) and accuracy (bottom) vs iteration from metrics.jsonl, in full-width
    panels, one line per run; the held-out uniform token accuracy from eval.json as a star at the
    final iteration. ``log_x``: a log iteration axis (None: when the runs' lengths differ by more
    than ``LOG_SPAN``×, so short runs are not squeezed into the start of a long axis)."""
    runs = [r for r in runs if r.metrics]
    if not runs:
        return None
    palette = palette_for((r.label for r in runs), palette)
    ends = [max(m["iteration"] for m in r.metrics) for r in runs]
    if log_x is None:
        log_x = max(ends) > LOG_SPAN * max(1, min(ends))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=["training loss (cross-entropy)", "training accuracy"])
    for run in runs:
        name = f"{run.label}, seed {run.seed}" if run.seed is not None else run.label
        full = f"{run.detail or run.label}, seed {run.seed}" if run.seed is not None else (run.detail or run.label)
        window = f"mean of {run.train.get('log_every', '?')} iterations × {run.train.get('batch_size', '?')} sequences"
        x = [m["iteration"] for m in run.metrics]
        for r, key, unit in ((1, "loss", "nats/token"), (2, "accuracy", "fraction")):
            fig.add_trace(go.Scatter(
                x=x, y=finite_or_none(m.get(key, np.nan) for m in run.metrics), mode="lines", name=name,
                legendgroup=name, showlegend=r == 1, line=dict(color=palette[run.label], width=1.5),
                hovertemplate=(f"{full}<br>{run.path.name}<br>iteration %{{x}}<br>{key} %{{y{NUM}}} {unit}<br>"
                               f"n = {window}<extra></extra>")), r, 1)
        held = (run.evaluation or {}).get("uniform")
        if held and "token_accuracy" in held:  # (a vector task's eval.json has a cosine similarity instead)
            fig.add_trace(go.Scatter(
                x=[run.evaluation["iteration"]], y=[held["token_accuracy"]], mode="markers", name=f"{name} held-out",
                legendgroup=name, showlegend=False, marker=dict(symbol="star", size=12, color=palette[run.label]),
                hovertemplate=(f"{full}<br>held-out uniform token accuracy %{{y{NUM}}}<br>n = {held['n']} "
                               f"sequences<extra></extra>")), 2, 1)
    if log_x:  # a little room left of the first point, so its tick label clears the y axis's
        first = min(min(m["iteration"] for m in r.metrics) for r in runs)
        fig.update_xaxes(type="log", dtick=1, range=[np.log10(max(1, first)) - 0.15, np.log10(max(ends)) + 0.05])
    fig.update_xaxes(title_text="training iteration" + " (log scale)" * log_x, row=2, col=1)
    fig.update_yaxes(title_text="loss (nats per token)", row=1, col=1)
    fig.update_yaxes(title_text="accuracy (fraction)", row=2, col=1)
    return finish(fig, "Training curves (metrics.jsonl; ★ = held-out uniform token accuracy, eval.json)", 640, "run",
                  legend="below")
