"""`gradscope sweep`: the dry run lists the grid and runs nothing, and an output directory holding
other settings or analyses is refused before anything runs."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

import gradscope
from gradscope.cli.app import app
from gradscope.workflows.study.reproduce import Layout
from gradscope.workflows.sweep.grid import parse_spec, plan_points

from tests.workflows.sweep.test_grid import GRID, grid


def test_dry_run_lists_the_grid_and_runs_nothing(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["sweep", str(grid(tmp_path)), "--dry-run", "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.stderr
    assert "gru-sinusoidal-K8-s2" in result.stdout and "to run" in result.stdout
    assert not (tmp_path / "out").exists()
    both = runner.invoke(app, ["sweep", str(grid(tmp_path)), "--scheduler", "tcp://127.0.0.1:1", "--workers", "2",
                               "-o", str(tmp_path / "o2")])
    assert both.exit_code == 2 and "--workers" in both.stderr
    bad = runner.invoke(app, ["sweep", str(grid(tmp_path)), "--resources", "GPU", "-o", str(tmp_path / "o3")])
    assert bad.exit_code == 2 and "--resources: got 'GPU'" in bad.stderr and not (tmp_path / "o3").exists()


def test_a_directory_holding_other_settings_is_refused_before_anything_runs(runner: CliRunner, tmp_path: Path) -> None:
    from gradscope.store.manifest import write_manifest
    from gradscope.train import train
    spec, out = grid(tmp_path, seeds="[1]"), tmp_path / "out"
    parsed = parse_spec(spec.read_text())
    write_manifest(out.mkdir() or out, {"analyses": {"accuracy": None}}, [])  # a sweep made with other analyses
    result = runner.invoke(app, ["sweep", str(spec), "--out", str(out)])
    assert result.exit_code == 2 and "analyses ([accuracy]/[stability]) differ" in result.stderr
    (out / "sweep.json").unlink()
    point = plan_points(parsed)[0]
    other = plan_points(parse_spec(GRID.format(iterations=60, every=20, seeds="[1]")))[0]
    train(other.run.config, Layout(out).run(point.run), stop_after=2)  # same name, other configuration
    result = runner.invoke(app, ["sweep", str(spec), "--out", str(out)])
    assert result.exit_code == 2 and f"different configuration than this spec ({point.name})" in result.stderr
    assert not (out / "sweep.json").exists() and gradscope.load(Layout(out).run(point.run)).iteration == 2


def test_a_sweep_whose_analyses_differ_is_refused(tmp_path: Path) -> None:
    """A sweep's manifest records its analyses' options by field name: the same spec on that directory resumes;
    a spec whose analyses differ is refused (their stores would mix settings)."""
    from gradscope.store.manifest import write_manifest

    spec_file = tmp_path / "spec.toml"
    spec_file.write_text('name = "s"\npreset = "tiny"\n[axes]\nseed = [1]\n[stability]\ntriplets = 4\n')
    described = parse_spec(spec_file.read_text()).analyses.describe()
    out = tmp_path / "sweep"
    out.mkdir()
    write_manifest(out, {"name": "s", "spec": spec_file.read_text(), "command": "", "analyses": described}, [])
    result = CliRunner().invoke(app, ["sweep", str(spec_file), "--out", str(out), "--dry-run"])
    assert result.exit_code == 0, result.output
    described["stability"]["triplets"] = 8
    write_manifest(out, {"name": "s", "spec": spec_file.read_text(), "command": "", "analyses": described}, [])
    result = CliRunner().invoke(app, ["sweep", str(spec_file), "--out", str(out), "--dry-run"])
    assert result.exit_code == 2 and "differ from this spec's" in result.stderr, result.output
