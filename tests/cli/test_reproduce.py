"""`gradscope reproduce` end to end on a micro configuration, and its resumability."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

import gradscope
from gradscope.cli.app import app
from gradscope.store import read_store
from tests.helpers.runs import DEFAULT_CORE

MICRO = ["--models", DEFAULT_CORE, "--seeds", "1,2", "--iterations", "8", "--triplets", "2", "-q"]


def test_reproduce_micro_end_to_end_and_resume(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "study"
    result = runner.invoke(app, ["reproduce", "-o", str(out), *MICRO])
    assert result.exit_code == 0, result.stderr
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == ["gru-none-s1", "gru-none-s2", "gru-sinusoidal-s1", "gru-sinusoidal-s2"]
    assert gradscope.load(out / "runs" / "gru-sinusoidal-s2").iteration == 8
    assert read_store(out / "stores" / "stability-gru-none-s1.zarr").sizes["checkpoint"] == 4
    summary = read_store(out / "summary-accuracy.zarr", kind="summary")
    assert summary.sizes["group"] == 2 and summary["n"].sel(metric="token_accuracy").values.tolist() == [2, 2]
    assert (out / "report.html").stat().st_size > 1_000_000  # plotly.js embedded
    assert "pe=sinusoidal" in result.stdout
    stamps = {p: p.stat().st_mtime_ns for p in (out / "stores").iterdir()}
    again = runner.invoke(app, ["reproduce", "-o", str(out), *MICRO])
    assert again.exit_code == 0, again.stderr
    assert {p: p.stat().st_mtime_ns for p in (out / "stores").iterdir()} == stamps  # nothing recomputed


def test_dry_run_prints_the_plan(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["reproduce", "--dry-run", "--no-measure", "--scale", "paper", "-o", str(tmp_path / "s")])
    assert result.exit_code == 0, result.stderr
    assert "lstm-sinusoidal-s3" in result.stdout and "300,000" in result.stdout
    assert not (tmp_path / "s").exists()
    bad = runner.invoke(app, ["reproduce", "--models", "transformer", "--dry-run"])
    assert bad.exit_code == 2 and "--models: got 'transformer'" in bad.stderr
