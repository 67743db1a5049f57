"""`gradscope report`: a real headless-Chromium render, figure builders against store numbers, errors."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from typer.testing import CliRunner

from gradscope.cli.app import app
from gradscope.reports.accuracy_figures import vocab_figure
from gradscope.reports.stability_figures import stability_figure
from gradscope.store import read_store, write_store
from gradscope.store.inputs import load_inputs, stability_curves


@pytest.fixture(scope="module")
def report_inputs(trained_runs: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real tiny stores: stability and accuracy of a dual-frequency GRU run, and a summary of two runs."""
    runner, d = CliRunner(), tmp_path_factory.mktemp("report-inputs")
    out = {"run": trained_runs["gru"], "stability": d / "st.zarr", "accuracy": d / "acc.zarr",
           "accuracy2": d / "acc2.zarr", "summary": d / "sum.zarr"}
    assert runner.invoke(app, ["stability", str(out["run"]), "-o", str(out["stability"]), "-q", "--triplets", "4",
                               "--resamples", "200"]).exit_code == 0
    for key, run in (("accuracy", "gru"), ("accuracy2", "lstm")):
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


def _browser(tmp_path: Path) -> list[str]:
    """Headless Chromium with no network at all: a dead proxy and no name resolution."""
    return [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", "--proxy-server=127.0.0.1:9",
            "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0",
            "--virtual-time-budget=15000", "--window-size=1200,3000"]


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
    bad = runner.invoke(app, ["report", str(report_inputs["stability"]), "-o", str(tmp_path / "b.html"),
                              "--static", "gif"])
    assert bad.exit_code == 2 and "--static" in bad.stderr
