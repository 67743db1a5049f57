"""`gradscope accuracy` end to end (SPEC §5): the store equals the library's evaluation, the grid is
indexed right, and bad options are errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import gradscope
from gradscope.cli.app import app
from gradscope.store import read_store
from gradscope.train import evaluate_heldout
from gradscope.workflows.families import tokens as token_evaluation  # the default evaluation (issue #39)


def _run(runner: CliRunner, *args: object) -> "object":
    return runner.invoke(app, [*map(str, args)])


def test_accuracy_store_matches_the_library_evaluation(runner: CliRunner, trained_runs: dict, tmp_path: Path) -> None:
    out = tmp_path / "a.zarr"
    result = _run(runner, "accuracy", trained_runs["dual"], "-o", out, "-q", "--bins", "2")
    assert result.exit_code == 0, result.stderr
    assert "frequent/rare" in result.stdout and "mean DL distance" in result.stdout
    ds = read_store(out, kind="accuracy")
    assert ds["iteration"].values.tolist() == [10, 20, 30]
    loaded = gradscope.load(trained_runs["dual"])
    from gradscope.tasks import make_task
    reference = evaluate_heldout(loaded.model, make_task(loaded.config.task), loaded.heldout)
    assert float(ds["token_accuracy"][-1]) == pytest.approx(reference["uniform"]["token_accuracy"])
    assert float(ds["sequence_accuracy"][-1]) == pytest.approx(reference["uniform"]["sequence_accuracy"])
    for t, tg in enumerate(("frequent", "rare")):
        for d, dg in enumerate(("frequent", "rare")):
            assert float(ds["grid_accuracy"][-1, t, d].mean()) == pytest.approx(reference["grid"][f"{tg}/{dg}"])
    assert ds["bin_start"].values.tolist() == [1, 3] and ds["bin_end"].values.tolist() == [2, 4]
    assert int(ds["grid_n"].sum()) == 2 * 2 * 2 * 4  # 2×2 cells, N=2 per position, L=4


def test_grid_is_indexed_right_end_to_end(runner: CliRunner, trained_runs: dict, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A predictor that reverses perfectly except for rare targets at position 3 among frequent
    disturbants shows exactly that grid cell wrong."""
    L, p0 = 4, 3

    def fake_predict(model: object, inputs: torch.Tensor, chunk: int = 0) -> torch.Tensor:
        preds = inputs.clone()
        preds[:, L:] = inputs[:, :L].flip(1)
        x = inputs[:, :L]
        others = torch.cat([x[:, :p0 - 1], x[:, p0:]], dim=1)
        hit = (x[:, p0 - 1] >= 4) & (others < 4).all(1)
        preds[hit, 2 * L - p0] = (preds[hit, 2 * L - p0] + 1) % 8
        return preds

    monkeypatch.setattr(token_evaluation, "predict", fake_predict)
    out = tmp_path / "a.zarr"
    assert _run(runner, "accuracy", trained_runs["dual"] / "step-0000030.pt", "-o", out, "-q").exit_code == 0
    acc = read_store(out)["grid_accuracy"].values[0]  # (tg, dg, position)
    expected = np.ones((2, 2, L))
    expected[1, 0, p0 - 1] = 0.0
    # bit for bit: accuracies from integer hit counts (deterministic by construction)
    np.testing.assert_array_equal(acc, expected)


def test_accuracy_errors(runner: CliRunner, trained_runs: dict, tmp_path: Path) -> None:
    result = _run(runner, "accuracy", trained_runs["uniform"], "--grid", "-o", tmp_path / "a.zarr")
    assert result.exit_code == 2 and "no frequency grid" in result.stderr
    result = _run(runner, "accuracy", trained_runs["dual"], "--bins", "1,2", "-o", tmp_path / "a.zarr")
    assert result.exit_code == 2 and "--bins" in result.stderr
    assert not (tmp_path / "a.zarr").exists()
