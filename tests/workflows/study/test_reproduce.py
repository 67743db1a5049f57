"""The study loop from Python (``gradscope.reproduce``): it writes the stores and summaries the command
writes, resumes half-trained runs and refuses foreign ones, and measures training steps for the plan."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

import gradscope
from gradscope.cli.app import app
from gradscope.store import read_store
from tests.helpers.runs import DEFAULT_CORE


def test_half_trained_runs_are_resumed_and_foreign_runs_refused(tmp_path: Path) -> None:
    from gradscope.train import train
    from gradscope.workflows.study.reproduce import Layout, train_step
    from gradscope.workflows.study.runs import plan_runs
    layout = Layout(tmp_path / "study")
    planned = plan_runs("tiny", [DEFAULT_CORE], [1], iterations=8, pes=("none",))[0]
    train(planned.config, layout.run(planned), stop_after=4)
    assert train_step(planned, layout) == "resumed"
    assert gradscope.load(layout.run(planned)).iteration == 8
    assert train_step(planned, layout) == "done earlier"
    other = plan_runs("tiny", [DEFAULT_CORE], [2], iterations=8, pes=("none",))[0]
    import pytest
    from gradscope.errors import GradscopeError
    with pytest.raises(GradscopeError, match="different configuration"):
        train_step(type(other)(planned.name, other.config), layout)


def test_the_study_loop_runs_from_python_as_the_command_runs_it(runner: CliRunner, tmp_path: Path) -> None:
    """gradscope.reproduce (issue #39: the loop lives in workflows/reproduce.py) writes the stores and
    summaries the command writes, with the same numbers; a bad option is one GradscopeError."""
    import numpy as np
    import pytest

    from gradscope.errors import GradscopeError

    cli, py = tmp_path / "cli", tmp_path / "py"
    args = ["--models", DEFAULT_CORE, "--seeds", "1", "--iterations", "6", "--triplets", "2", "-q"]
    assert runner.invoke(app, ["reproduce", "-o", str(cli), *args]).exit_code == 0
    result = gradscope.reproduce(py, models=(DEFAULT_CORE,), seeds=(1,), iterations=6, triplets=2)
    assert sorted(result.summaries) == ["accuracy", "stability"]
    assert sorted(p.name for p in (py / "stores").iterdir()) == sorted(p.name for p in (cli / "stores").iterdir())
    for name in ("summary-accuracy.zarr", "summary-stability.zarr"):
        a, b = read_store(cli / name, kind="summary"), read_store(py / name, kind="summary")
        np.testing.assert_array_equal(a["mean"].values, b["mean"].values)
    assert not (py / "report.html").exists()  # the report is drawn at the edge
    with pytest.raises(GradscopeError, match="target_pos/probe_length: they set the lm study"):
        gradscope.reproduce(tmp_path / "x", target_pos=3)
    with pytest.raises(GradscopeError, match="model: not an option of reproduce"):
        gradscope.reproduce(tmp_path / "x", model=DEFAULT_CORE)
    assert not (tmp_path / "x").exists()


def test_the_dry_run_measures_training_steps_from_python_as_the_command_does(runner: CliRunner, tmp_path: Path) -> None:
    """--dry-run's CPU-time column: a few real training steps of each planned configuration, timed by
    gradscope.workflows.study.reproduce.seconds_per_step (a notebook can call it on the plan)."""
    import math

    from gradscope.workflows.study.reproduce import estimate_seconds, plan_study, seconds_per_step
    from gradscope.workflows.study.options import StudyOptions

    study = plan_study(StudyOptions(seeds="1", iterations=10), tmp_path / "s")
    seconds = seconds_per_step(study.runs[0])
    assert math.isfinite(seconds) and 0 < seconds < 60
    estimates = estimate_seconds(study.runs)  # per run: its configuration's measured step times its iterations
    assert list(estimates) == [r.name for r in study.runs]
    assert all(math.isfinite(v) and 0 < v < 60 * r.config.train.iterations for r, v in zip(study.runs, estimates.values()))
    result = runner.invoke(app, ["reproduce", "--dry-run", "--seeds", "1", "--iterations", "10", "-o", str(tmp_path / "s")])
    assert result.exit_code == 0, result.stderr
    assert "CPU time (measured steps)" in result.stdout and " min" in result.stdout
    assert not (tmp_path / "s").exists()
