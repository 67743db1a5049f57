"""The stability figures against the stores' numbers: the curves are the store means, the band is a
bootstrap interval over pooled seeds or a t-interval over seed means (and renders in headless
Chromium), and the distributions and spectra are the store's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from gradscope.analysis.bootstrap import bootstrap_mean
from gradscope.cli.app import app
from gradscope.reports.stability_figures import condition_text, distribution_figure, spectra_figure, stability_figure
from gradscope.store import read_store, write_store
from gradscope.store.inputs import load_inputs, mean_spectra, stability_curves, stability_samples
from tests.reports.test_build import _render, report_inputs  # noqa: F401 - the fixture


def test_stability_curves_are_the_store_means(report_inputs: dict) -> None:
    items = load_inputs([report_inputs["stability"]])
    points = stability_curves(items, resamples=200)
    ds = read_store(report_inputs["stability"])
    fig = stability_figure(points)
    for p in points:
        mask = ds["condition"].values == p.condition
        at = int(np.flatnonzero(ds["iteration"].values == p.iteration)[0])
        expected = ds["score_default"].isel(checkpoint=at).sel(pair=p.pair).values[mask]
        assert p.interval.mean == pytest.approx(float(np.nanmean(expected)))
    ys = sorted(round(float(y), 12) for trace in fig.data if trace.y is not None and trace.mode and "lines" in trace.mode
                for y in trace.y if y is not None)
    assert sorted(round(p.interval.mean, 12) for p in points) == [y for y in ys if y in
                                                                 {round(p.interval.mean, 12) for p in points}]


def test_the_triplet_band_takes_the_confidence_asked_for(report_inputs: dict) -> None:
    """band over triplets (one seed): the percentile bootstrap at ``confidence``, as the seed band's t-interval is."""
    items = load_inputs([report_inputs["stability"]])
    ds = read_store(report_inputs["stability"])
    wide = stability_curves(items, resamples=300, seed=3)
    narrow = stability_curves(items, resamples=300, seed=3, confidence=0.5)
    assert [p.unit for p in narrow] == ["triplet"] * len(narrow)
    for w, p in zip(wide, narrow):
        at = int(np.flatnonzero(ds["iteration"].values == p.iteration)[0])
        values = ds["score_default"].isel(checkpoint=at).sel(pair=p.pair).values[ds["condition"].values == p.condition]
        ref = bootstrap_mean(values, resamples=300, seed=3, confidence=0.5)
        assert (p.interval.low, p.interval.high) == (ref.low, ref.high)
        assert w.interval.low <= p.interval.low <= p.interval.high <= w.interval.high
    assert any(w.interval.high - w.interval.low > p.interval.high - p.interval.low for w, p in zip(wide, narrow))


def test_stability_bands_are_bootstrap_cis_over_pooled_seeds(report_inputs: dict, tmp_path: Path) -> None:
    """With band="triplets", a second seed of the same configuration is pooled: CIs over the triplets of
    both stores."""
    ds = read_store(report_inputs["stability"])
    twin = ds.copy(deep=True)
    twin["score_default"] = twin["score_default"] * 0.5  # different numbers, same layout
    train = json.loads(twin.attrs["train_config"])
    twin.attrs["train_config"] = json.dumps({**train, "seed": train["seed"] + 1})
    write_store(twin, tmp_path / "twin.zarr")
    items = load_inputs([report_inputs["stability"], tmp_path / "twin.zarr"])
    assert len({i.label for i in items}) == 1
    points = stability_curves(items, resamples=300, seed=3, band="triplets")
    conditions = sorted(set(map(str, ds["condition"].values)))
    assert len(points) == 2 * len(conditions) * ds.sizes["checkpoint"]
    fig = stability_figure(points)
    for p in points:
        at = int(np.flatnonzero(ds["iteration"].values == p.iteration)[0])
        one = ds["score_default"].isel(checkpoint=at).sel(pair=p.pair)
        values = one.where(one["condition"] == p.condition, drop=True).values
        pooled = np.concatenate([values, values * 0.5])
        ref = bootstrap_mean(pooled, resamples=300, seed=3)
        assert (p.interval.mean, p.interval.low, p.interval.high, p.interval.n) == \
            pytest.approx((pooled.mean(), ref.low, ref.high, pooled.size))
        assert p.stores == 2
    pairs = list(dict.fromkeys(p.pair for p in points))
    conds = list(dict.fromkeys(p.condition for p in points))
    lines = [t for t in fig.data if not t.name.endswith((" upper", " lower"))]
    for t in lines:  # the band edges and the line are the intervals, in iteration order
        k = int(t.xaxis[1:] or 1) - 1  # panel (condition row, pair column)
        cond, pair = conds[k // len(pairs)], pairs[k % len(pairs)]
        mine = sorted((p for p in points if (p.condition, p.pair, p.label) == (cond, pair, t.name)),
                      key=lambda p: p.iteration)
        assert mine and pair in t.hovertemplate and condition_text(cond) in t.hovertemplate
        assert list(t.y) == pytest.approx([p.interval.mean for p in mine])
        assert [c[2] for c in t.customdata] == [p.interval.n for p in mine]
        uppers = [u for u in fig.data if u.name == f"{t.name} upper" and u.xaxis == t.xaxis]
        lowers = [u for u in fig.data if u.name == f"{t.name} lower" and u.xaxis == t.xaxis]
        assert list(uppers[0].y) == pytest.approx([p.interval.high for p in mine])
        assert list(lowers[0].y) == pytest.approx([p.interval.low for p in mine])
    assert len(lines) == 2 * len(conditions) and sum(bool(t.showlegend) for t in lines) == 1
    assert {t.name for t in lines} == {"GRU vanilla"}


def _seeds(report_inputs: dict, tmp_path: Path, factors: tuple[float, ...] = (1.0, 0.8, 0.6)) -> list[Path]:
    """The stability store as seeds of one configuration: seed k's scores are factors[k] × the store's."""
    ds = read_store(report_inputs["stability"])
    train = json.loads(ds.attrs["train_config"])
    paths = []
    for k, factor in enumerate(factors):
        twin = ds.copy(deep=True)
        twin["score_default"] = twin["score_default"] * factor
        twin.attrs["train_config"] = json.dumps({**train, "seed": 100 + k})
        write_store(twin, tmp_path / f"seed{k}.zarr")
        paths.append(tmp_path / f"seed{k}.zarr")
    return paths


def test_stability_band_over_seeds_is_a_t_interval_of_seed_means(report_inputs: dict, tmp_path: Path) -> None:
    """Several seeds of one configuration (the default band): the line is the mean of the seeds' mean
    scores, the band the Student t-interval over them, and each seed has its own hidden line."""
    factors = (1.0, 0.8, 0.6)
    paths = _seeds(report_inputs, tmp_path, factors)
    ds = read_store(paths[0])
    points = stability_curves(load_inputs(paths), resamples=300, seed=3)
    assert points and {p.unit for p in points} == {"seed"}
    for p in points:
        at = int(np.flatnonzero(ds["iteration"].values == p.iteration)[0])
        one = ds["score_default"].isel(checkpoint=at).sel(pair=p.pair)
        values = one.where(one["condition"] == p.condition, drop=True).values
        means = np.array([np.nanmean(values * f) for f in factors])
        half = stats.t.ppf(0.975, len(factors) - 1) * means.std(ddof=1) / np.sqrt(len(factors))
        assert (p.interval.mean, p.interval.low, p.interval.high, p.interval.n) == \
            pytest.approx((means.mean(), means.mean() - half, means.mean() + half, len(factors)), abs=1e-12)
        assert [s for s, _ in p.per_seed] == [100, 101, 102]
        assert [m for _, m in p.per_seed] == pytest.approx(list(means), abs=1e-12)
    fig = stability_figure(points)
    seeds = [t for t in fig.data if " · seed " in t.name]
    panels = len({(p.pair, p.condition) for p in points})
    assert len(seeds) == 3 * panels and all(t.visible == "legendonly" for t in seeds)
    assert sum(bool(t.showlegend) for t in seeds) == 3  # one legend entry per seed
    assert "seeds" in fig.layout.title.text and "t-interval" in fig.layout.title.text


def test_report_with_seed_band_renders_in_headless_chromium(runner: CliRunner, report_inputs: dict,
                                                            tmp_path: Path) -> None:
    paths = _seeds(report_inputs, tmp_path)
    html = tmp_path / "seeds.html"
    result = runner.invoke(app, ["report", *map(str, paths), "-o", str(html), "--resamples", "200"])
    assert result.exit_code == 0, result.stderr
    page = html.read_text()
    assert "Student t-interval over seeds" in page and "seed 101" in page
    plots, console = _render(html, tmp_path)
    assert not console, console
    layers, traces = plots["plot-stability"]
    assert layers >= 2 and traces >= 3
    pooled = tmp_path / "pooled.html"
    result = runner.invoke(app, ["report", *map(str, paths), "-o", str(pooled), "--band", "triplets",
                                 "--resamples", "200"])
    assert result.exit_code == 0, result.stderr
    assert "seeds) are pooled" in pooled.read_text() and "seed 101" not in pooled.read_text()
    bad = runner.invoke(app, ["report", *map(str, paths), "-o", str(tmp_path / "x.html"), "--band", "runs"])
    assert bad.exit_code == 2 and "band" in bad.stderr


def test_distributions_and_spectra_are_the_store_numbers(report_inputs: dict) -> None:
    ds = read_store(report_inputs["stability"])
    items = load_inputs([report_inputs["stability"]])
    fig = distribution_figure(stability_samples(items))
    assert [t.name for t in fig.data] == ["GRU vanilla"] * 2
    last = ds["score_default"].isel(checkpoint=-1)
    for t in fig.data:
        pair = "same-target" if (t.xaxis or "x") == "x" else "same-suffix"
        for cond in set(map(str, ds["condition"].values)):
            got = [y for x, y in zip(t.x, t.y) if x == cond]
            want = last.sel(pair=pair).where(last["condition"] == cond, drop=True).values
            assert sorted(got) == pytest.approx(sorted(want))
    spectra = spectra_figure(mean_spectra(items))
    sv = ds["singular_values"].isel(checkpoint=-1)
    means = sv.groupby("condition").mean(("member", "triplet"))  # independent route: xarray groupby
    for t in spectra.data:
        cond = next(c for c in map(str, means["condition"].values) if condition_text(c) in t.hovertemplate)
        assert list(t.y) == pytest.approx(means.sel(condition=cond).values)
        assert f"n = {3 * int((ds['condition'] == cond).sum())} Jacobians" in t.hovertemplate
    assert spectra.layout.yaxis.type == "log"
