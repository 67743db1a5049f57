"""The report page (``gradscope.reports.html``): the page around the sections, written out here; plotly.js
inline once, with the first figure, and nothing from the network; paths and commands as a report shows them
(never the machine's home or work directory); and the provenance table of the inputs. That the page renders
in a browser and its text never overlaps is tests/reports/test_build.py's and test_report_layout.py's."""

from __future__ import annotations

import re
from pathlib import Path

import plotly.graph_objects as go
import pytest
import xarray as xr

from gradscope.reports.html import (CSS, PLOT_CONFIG, Section, figure_html, provenance_html, public_command,
                                    public_path, render_page)
from gradscope.store.inputs import Input

LIBRARY = "* plotly.js v"  # the licence header that opens the inlined library
CWD = Path("/work/study")


def test_a_page_of_sections_without_figures_is_this_html() -> None:
    page = render_page("Runs <&> stores", "<p>head</p>", [Section("a", "First & one", "<i>c1</i>", body="<p>b1</p>"),
                                                          Section("b-2", "Second", "c2")], footer="made by <b>me</b>")
    assert page == (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>Runs &lt;&amp;&gt; stores</title><style>{CSS}</style></head><body>'
        '<header><h1>Runs &lt;&amp;&gt; stores</h1><p>head</p></header>'
        '<nav><h2>Contents</h2><ol><li><a href="#a">First &amp; one</a></li><li><a href="#b-2">Second</a></li></ol></nav>'
        '<section id="a"><h2>First &amp; one</h2><p class="caption"><i>c1</i></p><p>b1</p></section>'
        '<section id="b-2"><h2>Second</h2><p class="caption">c2</p></section>'
        '<footer class="meta">made by <b>me</b></footer></body></html>\n')


@pytest.fixture(scope="module")
def fig() -> go.Figure:
    return go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))


def test_a_figure_carries_plotly_js_only_when_first(fig: go.Figure) -> None:
    first, later = figure_html(fig, "plot-a", True), figure_html(fig, "plot-b", False)
    assert first.count(LIBRARY) == 1 and LIBRARY not in later
    assert 'id="plot-a"' in first and 'id="plot-b"' in later
    assert len(first) > 1_000_000 > 100_000 > len(later)  # the library inline (~4.8 MB), then the figure alone
    for html in (first, later):
        assert not re.search(r"<script[^>]*\bsrc=", html)  # nothing loaded from the network
        assert '"displaylogo": false' in html  # PLOT_CONFIG
        assert "MathJax.js" not in html
    assert PLOT_CONFIG["toImageButtonOptions"] == {"format": "svg"}


def test_the_page_inlines_plotly_js_once_with_its_first_figure(fig: go.Figure) -> None:
    page = render_page("t", "", [Section("intro", "Intro", "no figure", body="<p>text</p>"),
                                 Section("one", "One", "c", fig, body="<p>after</p>"), Section("two", "Two", "c", fig)])
    assert page.count(LIBRARY) == 1
    assert page.index('<section id="one">') < page.index(LIBRARY) < page.index('<section id="two">')
    assert 'id="plot-one"' in page and 'id="plot-two"' in page and "plot-intro" not in page
    one = page[page.index('<section id="one">'):page.index('<section id="two">')]
    assert one.index('id="plot-one"') < one.index("<p>after</p>")  # the figure, then the section's body


@pytest.mark.parametrize("path, shown", [
    ("runs/gru-none-s1", "runs/gru-none-s1"),  # relative: as given
    ("../elsewhere/s.zarr", "../elsewhere/s.zarr"),
    ("/work/study/runs/a", "runs/a"),  # inside the working directory: relative to it
    (Path("/work/study/x/../stores/s.zarr"), "stores/s.zarr"),
    ("/work/study", "."),
    ("/home/me/runs/gru-none-s1", "…/runs/gru-none-s1"),  # outside: its last two parts
    ("/work/studyX/s.zarr", "…/studyX/s.zarr"),  # a sibling that starts alike is outside
    ("/s.zarr", "s.zarr"),
])
def test_a_path_is_shown_without_the_machines_directories(path: str | Path, shown: str) -> None:
    assert public_path(path, CWD) == shown


def test_a_home_path_is_shown_by_its_last_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/me")
    assert public_path("~/runs/a", CWD) == "…/runs/a"
    monkeypatch.chdir("/")
    assert public_path("/usr/lib") == "usr/lib"  # the working directory by default


def test_a_command_shows_its_paths_as_the_report_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/me")
    plain = "gradscope report  runs/a 'x  y' -o r.html"
    assert public_command(plain, CWD) is plain  # no absolute path: untouched, spacing and quotes too
    assert public_command("gradscope report /home/me/runs/a /work/study/s.zarr -o /work/study/r.html --seed 3", CWD) \
        == "gradscope report …/runs/a s.zarr -o r.html --seed 3"
    assert public_command("gradscope report ~/runs/a", CWD) == "gradscope report …/runs/a"
    assert public_command("gradscope report '/home/me/my runs/x y.zarr' --title 'a b'", CWD) == \
        "gradscope report '…/my runs/x y.zarr' --title 'a b'"  # words with spaces stay one word
    assert public_command("gradscope 'unbalanced /home/me/a/x", CWD) == \
        "gradscope ''\"'\"'unbalanced' …/a/x"  # no shell parse: split at spaces, quotes kept as characters


def _run_input(**kw: object) -> Input:
    checkpoints = [{"path": "/home/me/run/step-10.pt", "iteration": 10, "sha256": ""},
                   {"path": "/home/me/run/step-20.pt", "iteration": 20, "sha256": "abcdef0123456789"}]
    base = dict(path=CWD / "runs" / "a", kind="run", model={"core": "gru"},
                task={"name": "reverse", "vocab_size": 8, "length": 4, "distribution": "dual", "rarity": 0.125},
                train={"seed": 3}, label="GRU <vanilla>", detail="GRU vanilla, seed 3",
                meta={"checkpoints": checkpoints, "gradscope_version": "1.2", "torch_version": "2.13",
                      "created": "2024-01-01T00:00:00+00:00", "command": "gradscope train -o /home/me/run"})
    return Input(**{**base, **kw})  # type: ignore[arg-type]


def test_the_provenance_row_of_a_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # every path of the input lies outside it
    table = provenance_html([_run_input()])
    row = re.search(r"<tr><td>.*?</tr>", table).group(0)  # type: ignore[union-attr]
    cells = re.findall(r"<td>(.*?)</td>", row)
    assert cells[0] == "<code>…/<wbr>runs/<wbr>a</code>"  # breaks at its slashes
    assert cells[1:3] == ["run", '<b>GRU &lt;vanilla&gt;</b><br><span class="meta">GRU vanilla, seed 3</span>']
    assert cells[3:5] == ["reverse K=8 L=4 (dual-frequency, rarity 0.125)", "3"]
    assert cells[5].startswith('2 at 10–20; last <code title="abcdef0123456789">abcdef012345</code><details>')
    assert "<li>10: step-10.pt </li>" in cells[5] and "<li>20: step-20.pt <code" in cells[5]  # file names only
    assert cells[6:] == ["gradscope 1.2 torch 2.13", "2024-01-01T00:00:00+00:00", "<code>gradscope train -o …/me/run</code>"]
    config = re.search(r"<details><summary>…/runs/a: configuration</summary><pre>(.*?)</pre>", table, re.S)
    assert config is not None and "&quot;core&quot;: &quot;gru&quot;" in config.group(1)
    assert "/home/me" not in table and str(CWD) not in table


def test_what_an_input_lacks_is_left_blank() -> None:
    row = provenance_html([_run_input(model={}, task={}, train={}, detail="GRU <vanilla>", meta={})])
    cells = re.findall(r"<td>(.*?)</td>", row)
    assert cells[2:] == ["<b>GRU &lt;vanilla&gt;</b>", "", "", "", "", "", "<code></code>"]  # detail = label: once
    assert "<details>" not in row  # no configuration to show
    one = _run_input(meta={"checkpoints": [{"path": "a/step-5.pt", "iteration": 5}]})
    assert "1 at 5<details>" in provenance_html([one])
    none = _run_input(meta={"checkpoints": [{"path": "a/model.pt", "iteration": None, "sha256": "ff"}]})
    assert '1 at ?; last <code title="ff">ff</code>' in provenance_html([none])
    uniform = _run_input(task={"name": "sort", "vocab_size": 6, "length": 3, "distribution": "uniform"})
    assert "<td>sort K=6 L=3 (uniform)</td>" in provenance_html([uniform])


def test_a_summary_is_described_by_its_grouping_and_interval() -> None:
    ds = xr.Dataset(coords={"group": [0, 1, 2]}, attrs={"by": '["core", "pe"]', "unit": "trial", "method": "percentile",
                                                        "confidence": 0.95, "resamples": 1000})
    summary = Input(Path("s.zarr"), "summary", ds=ds, label="ignored")
    cells = re.findall(r"<td>(.*?)</td>", provenance_html([summary]))
    assert cells[1:3] == ["summary", "3 groups by core, pe; unit trial, percentile 0.95 CI, 1000 resamples"]
    bare = Input(Path("s.zarr"), "summary", ds=xr.Dataset())
    assert re.findall(r"<td>(.*?)</td>", provenance_html([bare]))[2] == "0 groups by ?; unit ,   CI,  resamples"


def test_the_table_has_one_row_per_input_in_order() -> None:
    table = provenance_html([_run_input(label="first"), _run_input(label="second", kind="accuracy")])
    assert table.startswith("<table><tr><th>input</th><th>kind</th><th>configuration</th>")
    assert table.count("<tr><td>") == 2 and table.index("first") < table.index("second")
    assert table.count("<details><summary>") == 2 + 2  # each input's checkpoints, and its configuration
