"""The report read as a page (issue #30): measured in headless Chromium, no text of any figure overlaps
another or crosses the figure's edge; Figure 5 draws every configuration of a condition in one panel,
in distinct colours kept throughout the report; no build-machine path in samples or reports."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import plotly.graph_objects as go
import pytest
import torch
from typer.testing import CliRunner

from gradscope.cli.app import app
from gradscope.reports import ReportOptions, Section, build_sections, render_page
from gradscope.store.inputs import load_inputs

from tests.helpers.layout_check import measure, problems
from tests.reports.test_build import _browser as _report_browser

SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"
README_STORES = {"gru-vanilla.zarr": "gru60k-none-s5", "gru-pe.zarr": "gru60k-sinusoidal-s5"}
README_RUNS = sorted([*SAMPLES.glob("*-s1"), *SAMPLES.glob("gru60k-*-s5")])  # the README's report inputs
DYNAMICS = ["--sequences", "2", "--grid-sequences", "2", "--trajectories", "3", "--steps", "64", "--lyap-warmup", "8",
            "--sv", "4", "-q"]


def _browser(tmp_path: Path) -> list[str]:
    """Headless Chromium, no network, 1400 px wide (the width of the issue's screenshot)."""
    return _report_browser(tmp_path, width=1400)


def _run(*args: str) -> None:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.stderr


@pytest.fixture(scope="module")
def readme_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's first command on the shipped samples (16 triplets instead of 64: the same
    figures, labels and text, in a fraction of the time), with absolute input paths."""
    d = tmp_path_factory.mktemp("readme")
    for store, run in README_STORES.items():
        _run("stability", str(SAMPLES / run), "--target-freq", "rare", "--disturbant", "rare", "--triplets", "16",
             "--resamples", "200", "-q", "-o", str(d / store))
    runs = [str(p) for p in README_RUNS]
    _run("report", *runs, *(str(d / s) for s in README_STORES), "--resamples", "500", "-o", str(d / "report.html"))
    return d / "report.html"


@pytest.fixture(scope="module")
def every_figure_report(trained_runs: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A report with what the README's lacks: Figures 2 and 3 from a summary, the dynamics view, and
    stability in all four conditions (eight panels)."""
    d = tmp_path_factory.mktemp("every")
    _run("stability", str(trained_runs["dual"]), "--triplets", "4", "--resamples", "200", "-q", "-o", str(d / "st.zarr"))
    for run in ("dual", "other"):
        _run("accuracy", str(trained_runs[run]), "-q", "-o", str(d / f"acc-{run}.zarr"))
    _run("summarize", str(d / "acc-dual.zarr"), str(d / "acc-other.zarr"), "--resamples", "200", "-o", str(d / "s.zarr"))
    _run("dynamics", str(trained_runs["dual"]), "-o", str(d / "dyn.zarr"), *DYNAMICS)
    _run("report", str(trained_runs["dual"]), str(trained_runs["other"]), str(d / "s.zarr"), str(d / "dyn.zarr"),
         str(d / "st.zarr"), "--resamples", "500", "-o", str(d / "report.html"))
    return d / "report.html"


def test_layout_check_sees_overlaps_and_text_past_the_edge(tmp_path: Path) -> None:
    """The measurement can fail: two titles drawn on top of each other, and one past the right edge."""
    fig = go.Figure(go.Scatter(x=[1, 2], y=[1, 2]))
    fig.update_layout(width=600, height=300, annotations=[
        dict(text="one long title that runs on", x=0.4, y=1.05, xref="paper", yref="paper", showarrow=False),
        dict(text="another title, same place", x=0.45, y=1.05, xref="paper", yref="paper", showarrow=False),
        dict(text="a title far past the right edge of the figure", x=1.3, y=0.5, xref="paper", yref="paper",
             showarrow=False)])
    page = tmp_path / "bad.html"
    page.write_text(render_page("t", "", [Section("bad", "bad", "", fig)]))
    found = problems(measure(page, _browser(tmp_path), tmp_path))
    assert any("overlap" in p and "one long title" in p and "another title" in p for p in found), found
    assert any("crosses the figure edge" in p and "far past" in p for p in found), found


def _assert_readable(page: Path, tmp_path: Path, expected: set[str]) -> None:
    measured = measure(page, _browser(tmp_path), tmp_path)
    assert set(measured) == {f"plot-{e}" for e in expected}
    for div, m in measured.items():
        assert m["texts"] >= 8, (div, m)  # titles, ticks, legend: the figure was drawn and measured
    assert not problems(measured), "\n".join(problems(measured))


def test_readme_report_text_never_overlaps(readme_report: Path, tmp_path: Path) -> None:
    _assert_readable(readme_report, tmp_path, {"stability", "distribution", "spectra", "training"})


def test_every_figure_kind_text_never_overlaps(every_figure_report: Path, tmp_path: Path) -> None:
    _assert_readable(every_figure_report, tmp_path,
                     {"vocab-0", "grid-0", "stability", "distribution", "spectra", "flow", "tT-grid", "radius",
                      "lyapunov", "gates", "training"})


def test_accuracy_grid_text_never_overlaps(trained_runs: dict, tmp_path: Path) -> None:
    _run("accuracy", str(trained_runs["dual"]), "-q", "-o", str(tmp_path / "acc.zarr"))
    _run("report", str(tmp_path / "acc.zarr"), "-o", str(tmp_path / "r.html"))
    _assert_readable(tmp_path / "r.html", tmp_path, {"grid"})


def test_figure5_draws_each_condition_in_one_panel_one_colour_per_configuration(readme_report: Path) -> None:
    """Vanilla and PE GRU in the same panel for every (condition, pair kind), in distinct colours, and in
    the same colour wherever the report draws them (distributions, spectra, training curves)."""
    d = readme_report.parent
    items = load_inputs([*README_RUNS, *(d / s for s in README_STORES)])
    sections = {s.id: s.figure for s in build_sections(items, ReportOptions(resamples=200))}
    fig = sections["stability"]
    lines = [t for t in fig.data if not t.name.endswith((" upper", " lower"))]
    configurations = {i.label for i in items if i.kind == "stability"}
    assert configurations == {"GRU vanilla · 60k it", "GRU PE (sinusoidal) · 60k it"}
    panels: dict[str, dict[str, str]] = {}
    for t in lines:
        panels.setdefault(t.xaxis, {})[t.name] = t.line.color
    assert len(panels) == 2  # one condition (rare/rare) × two pair kinds
    colour = {}
    for panel in panels.values():
        assert set(panel) == configurations
        assert len(set(panel.values())) == len(panel)  # distinct colours in the panel
        for name, c in panel.items():
            assert colour.setdefault(name, c) == c  # and the same one in every panel
    for t in fig.data:  # the CI band of a line is its colour
        if t.name.endswith(" lower"):
            assert t.fillcolor.startswith("rgba(") and t.name[:-6] in colour
    for section in ("distribution", "spectra"):
        for t in sections[section].data:
            assert colour[t.name] in (t.marker.color, t.line.color), (section, t.name)
    training = {t.name.rsplit(", seed", 1)[0]: t.line.color for t in sections["training"].data if t.mode == "lines"}
    assert all(training[name] == c for name, c in colour.items())
    assert len(set(training.values())) == len(training) == 12  # twelve sample runs, twelve colours


# --- no build-machine paths -------------------------------------------------------------------------

ABSOLUTE = re.compile(r"(?<![\w.~-])(/(home|work|root|tmp|Users|mnt|opt|var|srv|data)\b|~/|[A-Z]:\\)")
BUILD_NOTES = re.compile(r"issue #\d+|session", re.I)


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def _absolute(text: str) -> list[str]:
    """Absolute paths in ``text``: any word of a command that starts with '/' or '~', and any
    home/work-like directory anywhere."""
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    return [w for w in words if w.startswith(("/", "~"))] + [m.group(0) for m in ABSOLUTE.finditer(text)]


def test_shipped_samples_hold_no_build_machine_paths_or_notes() -> None:
    manifest = json.loads((SAMPLES / "MANIFEST.json").read_text())
    found = [(SAMPLES / "MANIFEST.json", s) for s in _strings(manifest)]
    for config in SAMPLES.glob("*/config.json"):
        found += [(config, s) for s in _strings(json.loads(config.read_text()))]
    for ckpt in sorted(SAMPLES.glob("*/step-*.pt")):
        raw = torch.load(ckpt, map_location="cpu", weights_only=True)
        found += [(ckpt, s) for s in _strings({k: v for k, v in raw.items() if k not in ("model", "optimizer")})]
    assert len(found) > 100
    bad = [(str(p.relative_to(SAMPLES)), s) for p, s in found if _absolute(s) or BUILD_NOTES.search(s)]
    assert not bad, bad[:5]


def test_a_written_report_shows_no_absolute_path(readme_report: Path) -> None:
    """The report was made from absolute paths (pytest's temporary directory, the repository): none of
    them, and no home or work directory, appears in it; stores and runs are named by their last parts."""
    page = readme_report.read_text()
    start = page.index("<body>")
    text = re.sub(r"<script.*?</script>", "", page[start:], flags=re.S)  # plotly.js's own strings aside
    for root in (readme_report.parent, SAMPLES.parent, Path.home(), Path.cwd()):
        assert str(root) not in text, root
    assert not _absolute(re.sub(r"<[^>]+>", " ", text)), _absolute(re.sub(r"<[^>]+>", " ", text))[:5]
    assert "…/readme0/gru-vanilla.zarr" in text or "gru-vanilla.zarr" in text
    for fig in re.findall(r"<script.*?</script>", page[start:], flags=re.S)[1:]:  # the figures' data
        assert str(readme_report.parent) not in fig and str(SAMPLES) not in fig
