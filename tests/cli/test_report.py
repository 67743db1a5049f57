"""`gradscope report`: bad inputs and options are one-line errors that write nothing, and static export
works or says why."""

from __future__ import annotations

from pathlib import Path

import pytest
import xarray as xr
from typer.testing import CliRunner

from gradscope.cli.app import app
from gradscope.store import write_store
from tests.reports.test_build import report_inputs  # noqa: F401 - the fixture


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
