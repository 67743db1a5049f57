"""The report as built and rendered: a real headless-Chromium render of every figure kind, checks of
the checks, images exported whole or not at all, and only the figures with data shown. The figures'
numbers are checked in tests/reports/test_*_figures.py, the command's errors in tests/cli/test_report.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradscope.errors import GradscopeError
from gradscope.cli.app import app
from gradscope.reports import ReportOptions, build_sections, render_page
from gradscope.store.inputs import load_inputs


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
    _, sections = render_report(load_inputs([report_inputs["stability"]]), opts=ReportOptions())
    with pytest.raises(RuntimeError, match="kaleido died"):
        export_static(sections, tmp_path / "r.html", "png")
    assert not list(tmp_path.iterdir())


def test_render_report_takes_opts_or_its_fields_by_name(report_inputs: dict) -> None:
    """The analysis functions' shape: ``opts`` (ReportOptions) or its fields as keywords, the same page either way;
    an unknown name is one line."""
    from gradscope.reports.build import render_report

    items = load_inputs([report_inputs["accuracy"]])
    by_name, _ = render_report(items, title="a title of its own", command="gradscope report x")
    by_opts, _ = render_report(items, opts=ReportOptions(title="a title of its own", command="gradscope report x"))
    assert "a title of its own" in by_name and by_name == by_opts
    with pytest.raises(GradscopeError, match="^titel: not an option of render_report; its options are "):
        render_report(items, titel="typo")


# --- figure builders against the stores' numbers ------------------------------------------------

def test_only_figures_with_data_are_shown(trained_runs: dict, report_inputs: dict) -> None:
    sections = build_sections(load_inputs([trained_runs["dual"]]), ReportOptions())
    assert [s.id for s in sections] == ["training", "provenance"]
    sections = build_sections(load_inputs([report_inputs["accuracy"]]), ReportOptions())
    assert [s.id for s in sections] == ["grid", "provenance"]  # no runs, no stability: no such figures
    page = render_page("t", "", sections)
    assert page.count("plotly.js v") <= 2 and page.count("<section") == 2
