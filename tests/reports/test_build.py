"""`gradscope report`: a real headless-Chromium render, figure builders against store numbers, errors."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
from scipy import stats
import pytest
import xarray as xr
from typer.testing import CliRunner

from gradscope.analysis.bootstrap import bootstrap_mean
from gradscope.cli.app import app
from gradscope.errors import GradscopeError
from gradscope.models import CORES
from gradscope.reports import ReportOptions, build_sections, render_page
from gradscope.reports.accuracy_figures import grid_figure_accuracy, grid_figure_summary, training_figure, vocab_figure
from gradscope.reports.stability_figures import condition_text, distribution_figure, spectra_figure, stability_figure
from gradscope.store import provenance, read_store, write_store
from gradscope.store.inputs import (config_labels, load_inputs, mean_spectra, model_label, pe_label,
                                    stability_curves, stability_samples)
from tests.helpers.runs import DEFAULT_CORE, OTHER_CORE


@pytest.fixture(scope="module")
def report_inputs(trained_runs: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real tiny stores: stability and accuracy of a dual-frequency GRU run, and a summary of two runs."""
    runner, d = CliRunner(), tmp_path_factory.mktemp("report-inputs")
    out = {"run": trained_runs["dual"], "stability": d / "st.zarr", "accuracy": d / "acc.zarr",
           "accuracy2": d / "acc2.zarr", "summary": d / "sum.zarr"}
    assert runner.invoke(app, ["stability", str(out["run"]), "-o", str(out["stability"]), "-q", "--triplets", "4",
                               "--resamples", "200"]).exit_code == 0
    for key, run in (("accuracy", "dual"), ("accuracy2", "other")):
        assert runner.invoke(app, ["accuracy", str(trained_runs[run]), "-o", str(out[key]), "-q"]).exit_code == 0
    result = runner.invoke(app, ["summarize", str(out["accuracy"]), str(out["accuracy2"]), "-o", str(out["summary"]),
                                 "--resamples", "200"])
    assert result.exit_code == 0, result.stderr
    return out


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("Chromium is not installed: the report must be checked in a real browser (apt-get install chromium)")


def _browser(tmp_path: Path, width: int = 1200) -> list[str]:
    """Headless Chromium with no network at all: a dead proxy and no name resolution."""
    return [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", "--proxy-server=127.0.0.1:9",
            "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0",
            "--virtual-time-budget=15000", f"--window-size={width},3000"]


def _render(page: Path, tmp_path: Path) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """Load ``page``: ({plot div id: (main-svg layers, traces drawn)}, console messages)."""
    dom = subprocess.run([*_browser(tmp_path), "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]  # console.* and uncaught errors
    starts = [(m.start(), m.group(1)) for m in
              re.finditer(r'<div id="([^"]+)" class="[^"]*js-plotly-plot[^"]*"', dom.stdout)]
    plots = {}
    for (start, div_id), (end, _) in zip(starts, [*starts[1:], (len(dom.stdout), "")]):
        chunk = dom.stdout[start:end]
        plots[div_id] = (chunk.count('<svg class="main-svg"'), len(re.findall(r'<g class="trace[ "]', chunk)))
    return plots, console


def _no_network_refs(page: str) -> bool:
    return not re.search(r"""<(script|link|img|iframe)[^>]+(src|href)=["']?(https?:)?//""", page)


def test_report_renders_in_headless_chromium(runner: CliRunner, report_inputs: dict, tmp_path: Path) -> None:
    html = tmp_path / "report.html"
    args = [str(report_inputs[k]) for k in ("run", "stability", "accuracy", "summary")]
    result = runner.invoke(app, ["report", *args, "-o", str(html)])
    assert result.exit_code == 0, result.stderr
    expected = ["vocab-0", "grid-0", "stability", "distribution", "spectra", "training"]
    assert f"{len(expected)} figures: {', '.join(expected)}" in result.stdout
    page = html.read_text()
    assert page.count("plotly.js v") <= 2 and 4_000_000 < len(page) < 6_500_000  # plotly.js inline, once
    assert _no_network_refs(page), "the page loads something from the network"
    for anchor in [*expected, "provenance"]:  # table of contents → sections
        assert f'href="#{anchor}"' in page and f'<section id="{anchor}">' in page
    assert "vanilla" in page and "PE (sinusoidal)" in page
    plots, console = _render(html, tmp_path)
    assert not console, console
    assert sorted(plots) == sorted(f"plot-{e}" for e in expected)
    for div_id, (layers, traces) in plots.items():
        assert layers >= 2 and traces >= 1, (div_id, layers, traces)
    shot = tmp_path / "report.png"
    subprocess.run([*_browser(tmp_path), f"--screenshot={shot}", html.as_uri()], capture_output=True, timeout=120,
                   check=True)
    assert shot.stat().st_size > 10_000


def test_browser_checks_catch_a_broken_page(tmp_path: Path) -> None:
    """The checks above can fail: a script error, a network script and an undrawn plot are all seen."""
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><head><script src="https://cdn.plot.ly/plotly-3.0.0.min.js"></script>'
                    '</head><body><div id="plot-x" class="plotly-graph-div js-plotly-plot"></div>'
                    '<script>Plotly.newPlot("plot-x", [{y: [1, 2]}]);</script></body></html>')
    plots, console = _render(page, tmp_path)
    assert not _no_network_refs(page.read_text())
    assert any("Uncaught" in line and "Plotly" in line for line in console), console
    assert plots == {"plot-x": (0, 0)}


def test_vocab_figure_error_bars_are_the_store_numbers() -> None:
    from gradscope.analysis.bootstrap import Interval
    from gradscope.store.summary import summary_dataset
    from gradscope.workflows.summarize import SummaryEntry
    known = {("gru", "none", "16"): (0.70, 0.65, 0.74), ("gru", "none", "64"): (0.50, 0.41, 0.55),
             ("gru", "sinusoidal", "16"): (0.90, 0.88, 0.93), ("gru", "sinusoidal", "64"): (0.85, 0.80, 0.86)}
    entries = [SummaryEntry(key, " ".join(key), "token_accuracy", Interval(m, lo, hi, 5, 0), (1, 2, 3, 4, 5),
                            (m,) * 5) for key, (m, lo, hi) in known.items()]
    ds = summary_dataset(entries, ("core", "pe", "vocab_size"), {"kind": "summary"})
    fig = vocab_figure(ds)
    assert fig is not None and len(fig.data) == 2
    for trace in fig.data:
        pe = "none" if "vanilla" in trace.name.lower() else "sinusoidal"
        rows = [known[("gru", pe, k)] for k in ("16", "64")]
        assert list(trace.x) == [16, 64]
        assert list(trace.y) == pytest.approx([m for m, _, _ in rows])
        assert list(trace.error_y.array) == pytest.approx([hi - m for m, _, hi in rows])
        assert list(trace.error_y.arrayminus) == pytest.approx([m - lo for m, lo, _ in rows])


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


def test_report_errors(runner: CliRunner, report_inputs: dict, tmp_path: Path) -> None:
    none = runner.invoke(app, ["report", "-o", str(tmp_path / "r.html")])
    assert none.exit_code == 2 and "error:" in none.stderr
    write_store(xr.Dataset(attrs={"kind": "weird"}), tmp_path / "weird.zarr")
    weird = runner.invoke(app, ["report", str(tmp_path / "weird.zarr"), "-o", str(tmp_path / "r.html")])
    assert weird.exit_code == 2 and "not a gradscope store" in weird.stderr
    missing = runner.invoke(app, ["report", str(report_inputs["stability"]), "-o", str(tmp_path / "no" / "r.html")])
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
    for result in (none, weird, missing):
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "r.html").exists()


def test_static_export_works_or_says_why(runner: CliRunner, report_inputs: dict, tmp_path: Path) -> None:
    import importlib.util
    html = tmp_path / "r.html"
    result = runner.invoke(app, ["report", str(report_inputs["stability"]), "-o", str(html), "--static", "png"])
    if importlib.util.find_spec("kaleido") is None:
        assert result.exit_code == 2 and "kaleido" in result.stderr and result.stderr.count("\n") == 1
    else:
        assert result.exit_code == 0, result.stderr
        pngs = sorted(tmp_path.glob("r-*.png"))
        assert len(pngs) == 3 and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert not list(tmp_path.glob(".*.tmp"))
    bad = runner.invoke(app, ["report", str(report_inputs["stability"]), "-o", str(tmp_path / "b.html"),
                              "--static", "gif"])
    assert bad.exit_code == 2 and "--static" in bad.stderr


def test_static_images_appear_whole_or_not_at_all(report_inputs: dict, tmp_path: Path, monkeypatch) -> None:
    """Issue #24: images were written in place, so an export that died midway left half-written ones
    under their final names. A writer that writes half an image and dies leaves none, and no temporary."""
    import plotly.io as pio

    from gradscope.reports import build
    from gradscope.reports.build import ReportOptions, export_static, render_report
    from gradscope.store.inputs import load_inputs

    def dying(figs, paths, **kwargs):  # noqa: ANN001, ANN003 - plotly's signature
        Path(paths[0]).write_bytes(b"\x89PNG half")
        raise RuntimeError("kaleido died")

    monkeypatch.setattr(pio, "write_images", dying)
    monkeypatch.setattr(build, "_kaleido_major", lambda: 1)
    _, sections = render_report(load_inputs([report_inputs["stability"]]), ReportOptions())
    with pytest.raises(RuntimeError, match="kaleido died"):
        export_static(sections, tmp_path / "r.html", "png")
    assert not list(tmp_path.iterdir())


# --- figure builders against the stores' numbers ------------------------------------------------

def _summary(entries: dict[tuple[str, ...], dict[str, tuple[float, float, float]]], by: tuple[str, ...]) -> xr.Dataset:
    from gradscope.analysis.bootstrap import Interval
    from gradscope.store.summary import summary_dataset
    from gradscope.workflows.summarize import SummaryEntry
    rows = [SummaryEntry(key, " ".join(key), metric, Interval(m, lo, hi, 3, 0), (1, 2, 3), (m,) * 3)
            for key, metrics in entries.items() for metric, (m, lo, hi) in metrics.items()]
    return summary_dataset(rows, by, {"kind": "summary", "by": json.dumps(list(by)), "confidence": 0.95})


def _cell(fig, trace, rows: tuple[str, ...], cols: tuple[str, ...]) -> tuple[str, str]:
    """(row, column) names of the subplot a trace sits in (make_subplots numbers axes row-major)."""
    k = int(trace.xaxis[1:] or 1) - 1
    return rows[k // len(cols)], cols[k % len(cols)]


def test_grid_figure_from_a_summary_has_the_store_cis() -> None:
    rng = np.random.default_rng(0)
    cells = [(t, d) for t in ("frequent", "rare") for d in ("frequent", "rare")]
    known = {}
    for pe in ("none", "sinusoidal"):
        metrics = {}
        for t, d in cells:
            for b in (1, 2, 3):
                m = float(rng.uniform(0.2, 0.8))
                low, high = m - float(rng.uniform(0.01, 0.1)), m + float(rng.uniform(0.01, 0.1))
                metrics[f"grid/{t}/{d}/bin{b}"] = (m, low, high)
            metrics[f"grid/{t}/{d}"] = (0.5, 0.4, 0.6)  # the cell total is not a bin: not plotted
        known[("gru", pe)] = metrics
    fig = grid_figure_summary(_summary(known, ("core", "pe")))
    assert fig is not None and len(fig.data) == 2 * 4
    for trace in fig.data:
        pe = "none" if trace.name == "GRU vanilla" else "sinusoidal"
        assert trace.name in ("GRU vanilla", "GRU PE (sinusoidal)")
        t, d = _cell(fig, trace, ("frequent", "rare"), ("frequent", "rare"))
        rows = [known[("gru", pe)][f"grid/{t}/{d}/bin{b}"] for b in (1, 2, 3)]
        assert list(trace.x) == [1, 2, 3]
        assert list(trace.y) == pytest.approx([m for m, _, _ in rows])
        assert list(trace.error_y.array) == pytest.approx([hi - m for m, _, hi in rows])
        assert list(trace.error_y.arrayminus) == pytest.approx([m - lo for m, lo, _ in rows])
        assert [c[2] for c in trace.customdata] == [3, 3, 3] and "n = " in trace.hovertemplate
    assert grid_figure_summary(_summary({("gru", "none"): {"token_accuracy": (0.5, 0.4, 0.6)}}, ("core", "pe"))) is None
    assert vocab_figure(_summary({("gru", "none"): {"token_accuracy": (0.5, 0.4, 0.6)}}, ("core", "pe"))) is None


def _accuracy_store(path: Path, seed: int) -> Path:
    """An accuracy store in the documented layout (two checkpoints, 2×2 grid, 3 bins), known numbers."""
    rng = np.random.default_rng(seed)
    groups = np.asarray(["frequent", "rare"], dtype=object)
    ds = xr.Dataset(
        {"token_accuracy": ("checkpoint", rng.uniform(size=2)),
         "grid_bin_accuracy": (("checkpoint", "target_group", "disturbant_group", "bin"),
                               rng.uniform(size=(2, 2, 2, 3))),
         "grid_n": (("target_group", "disturbant_group", "bin"), rng.integers(5, 50, size=(2, 2, 3)))},
        coords={"checkpoint": [0, 1], "iteration": ("checkpoint", [100, 200]), "target_group": groups,
                "disturbant_group": groups, "bin": [0, 1, 2], "bin_start": ("bin", [1, 4, 7]),
                "bin_end": ("bin", [3, 6, 8])},
        attrs=provenance("accuracy", "test", "cpu", {
            "model_config": {"core": "lstm", "pe": "sinusoidal"}, "task_config": {"name": "reverse", "vocab_size": 8},
            "train_config": {"seed": seed}, "checkpoints": []}))
    return write_store(ds, path)


def test_grid_figure_from_accuracy_stores_has_no_ci(tmp_path: Path) -> None:
    paths = [_accuracy_store(tmp_path / f"a{s}.zarr", s) for s in (1, 2)]
    items = load_inputs(paths)
    assert {i.label for i in items} == {"LSTM PE (sinusoidal)"}  # same configuration, two seeds
    for iteration, k in ((None, 1), (100, 0)):
        fig = grid_figure_accuracy(items, iteration)
        assert len(fig.data) == 2 * 4
        for trace in fig.data:
            seed = int(trace.name.rsplit(" ", 1)[1])
            ds = read_store(paths[seed - 1])
            t, d = _cell(fig, trace, ("frequent", "rare"), ("frequent", "rare"))
            assert list(trace.y) == pytest.approx(
                ds["grid_bin_accuracy"].isel(checkpoint=k).sel(target_group=t, disturbant_group=d).values)
            n = ds["grid_n"].sel(target_group=t, disturbant_group=d).values.tolist()
            assert [c[2] for c in trace.customdata] == n
            assert trace.error_y.array is None
    assert list(fig.layout.xaxis3.ticktext) == ["1–3", "4–6", "7–8"]
    with pytest.raises(GradscopeError, match="iteration: got 150"):
        grid_figure_accuracy(items, 150)


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


def test_training_figure_is_metrics_jsonl(trained_runs: dict) -> None:
    run = trained_runs["dual"]
    items = load_inputs([run])
    fig = training_figure(items)
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    loss, acc, star = fig.data
    assert list(loss.x) == [m["iteration"] for m in lines] and list(loss.y) == [m["loss"] for m in lines]
    assert list(acc.y) == [m["accuracy"] for m in lines]
    evaluation = json.loads((run / "eval.json").read_text())
    assert list(star.y) == [evaluation["uniform"]["token_accuracy"]] and list(star.x) == [evaluation["iteration"]]
    assert loss.name == f"{CORES[DEFAULT_CORE].label} vanilla, seed 7"


def test_labels_say_vanilla_or_pe_and_what_differs(trained_runs: dict) -> None:
    assert pe_label("none") == "vanilla" and pe_label("learnable") == "PE (learnable)"
    assert model_label({"core": "s4d", "pe": "sinusoidal"}) == "S4D PE (sinusoidal)"
    items = load_inputs([trained_runs["dual"], trained_runs["uniform"], trained_runs["other"]])
    labels = [i.label for i in items]
    first, other = CORES[DEFAULT_CORE].label, CORES[OTHER_CORE].label
    assert labels == [f"{first} vanilla · 30 it, dual", f"{first} vanilla · 10 it, uniform", f"{other} PE (sinusoidal)"]
    assert items[0].detail.startswith(f"{first} vanilla [iterations=30, distribution=dual, ")  # every differing field


def _config(core: str = "gru", pe: str = "none", K: int = 64, L: int = 16, iterations: int = 6000,
            every: int = 1500, max_len: int = 32, lr: float = 3e-3) -> tuple[dict, dict, dict]:
    return ({"core": core, "pe": pe, "max_len": max_len, "hidden_size": 128},
            {"name": "reverse", "vocab_size": K, "length": L, "distribution": "dual"},
            {"iterations": iterations, "checkpoint_every": every, "lr": lr, "seed": 1, "threads": 1})


def test_short_labels_name_what_differs_and_leave_bookkeeping_out() -> None:
    """The shipped 6k and 60k GRUs differ in iterations, checkpoint_every and max_len: the short label
    names the iterations only, the full one all three; LSTM, alone, is core and PE."""
    configs = [_config(), _config(pe="sinusoidal"), _config(iterations=60000, every=5000, max_len=128),
               _config(pe="sinusoidal", iterations=60000, every=5000, max_len=128), _config("lstm")]
    got = config_labels(configs)
    assert [short for short, _ in got] == ["GRU vanilla · 6k it", "GRU PE (sinusoidal) · 6k it",
                                          "GRU vanilla · 60k it", "GRU PE (sinusoidal) · 60k it", "LSTM vanilla"]
    assert got[2][1] == "GRU vanilla [iterations=60000, checkpoint_every=5000, max_len=128]"
    assert all(len(short) <= 30 for short, _ in got)
    # a K × L grid needs both fields; lr changing with iterations adds one field, never more than two
    grid = config_labels([_config(K=k, L=n) for k in (32, 64) for n in (8, 16)])
    assert [short for short, _ in grid] == ["GRU vanilla · K=32, L=8", "GRU vanilla · K=32, L=16",
                                            "GRU vanilla · K=64, L=8", "GRU vanilla · K=64, L=16"]
    three = config_labels([_config(K=32, iterations=1000, lr=1e-3), _config(K=64, iterations=2000, lr=2e-3)])
    assert [short for short, _ in three] == ["GRU vanilla · 1k it, K=32", "GRU vanilla · 2k it, K=64"]
    # configurations told apart only by bookkeeping still get distinct labels
    books = config_labels([_config(every=100), _config(every=200)])
    assert books[0][0] != books[1][0] and "checkpoint_every=100" in books[0][0]


def test_only_figures_with_data_are_shown(trained_runs: dict, report_inputs: dict) -> None:
    sections = build_sections(load_inputs([trained_runs["dual"]]), ReportOptions())
    assert [s.id for s in sections] == ["training", "provenance"]
    sections = build_sections(load_inputs([report_inputs["accuracy"]]), ReportOptions())
    assert [s.id for s in sections] == ["grid", "provenance"]  # no runs, no stability: no such figures
    page = render_page("t", "", sections)
    assert page.count("plotly.js v") <= 2 and page.count("<section") == 2


def test_more_bad_inputs_are_one_line_errors(runner: CliRunner, report_inputs: dict, tmp_path: Path) -> None:
    store = str(report_inputs["stability"])
    (tmp_path / "exists.html").write_text("x")
    cases = {
        "does not exist": [str(tmp_path / "nope.zarr"), "-o", str(tmp_path / "r.html")],
        "is a file": [str(tmp_path / "exists.html"), "-o", str(tmp_path / "r.html")],
        "already exists": [store, "-o", str(tmp_path / "exists.html")],
        "--iteration: got 7": [store, "--iteration", "7", "-o", str(tmp_path / "r.html")],
        "--score: got 'cosine'": [store, "--score", "cosine", "-o", str(tmp_path / "r.html")],
    }
    for message, args in cases.items():
        result = runner.invoke(app, ["report", *args])
        assert result.exit_code == 2 and message in result.stderr, (message, result.stderr)
        assert result.stderr.count("\n") == 1
    assert not (tmp_path / "r.html").exists()


def test_static_export_without_a_browser_is_one_line_error(runner: CliRunner, report_inputs: dict, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("kaleido", reason="without kaleido the error is about kaleido (tested above)")
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chromium"))  # kaleido's browser lookup honours it
    html = tmp_path / "r.html"
    result = runner.invoke(app, ["report", str(report_inputs["stability"]), "-o", str(html), "--static", "svg"])
    assert result.exit_code == 2 and "Chromium" in result.stderr and result.stderr.count("\n") == 1
    assert not html.exists() and not list(tmp_path.glob("r-*.svg"))
