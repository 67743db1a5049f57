"""The dynamics figures: a report of a run and its dynamics store draws the flow, radius, Lyapunov,
gate and grid figures, checked in headless Chromium."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gradscope.cli.app import app

from tests.reports.test_build import _browser, _render  # the report's real-browser check
from tests.workflows.test_dynamics import dynamics_store  # noqa: F401 - the fixture


def test_report_draws_the_dynamics_figures(runner, dynamics_store: Path, trained_runs: dict, tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    result = runner.invoke(app, ["report", str(trained_runs["dual"]), str(dynamics_store), "-o", str(page)])
    assert result.exit_code == 0, result.stderr
    drawn, console = _render(page, tmp_path)
    for section in ("flow", "radius", "lyapunov", "gates"):
        layers, traces = drawn.get(f"plot-{section}", (0, 0))
        assert layers >= 3 and traces >= 1, (section, sorted(drawn))
    assert drawn.get("plot-tT-grid", (0, 0))[0] >= 3
    assert not console, console
    # heatmaps draw as images, not trace groups: look for them in the rendered DOM
    dom = subprocess.run([*_browser(tmp_path), "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    grid = dom[dom.index('id="plot-tT-grid"'):]
    grid = grid[:grid.index('id="plot-', 10)] if 'id="plot-' in grid[10:] else grid
    assert grid.count('class="hm"') >= 1
