"""Wiring: the batches the training loop really trains on never contain a held-out row (SPEC §3).

`tests/tasks/test_heldout.py` tests the sampler function. Here the real `gradscope train` command runs on every
task, with pattern spaces so small that a sampler without the exclusion would hit the held-out
set in most batches, and every row the model is trained on is recorded at the model's input
(`SeqModel.forward` in training mode). The held-out rows come from the run's own checkpoint (what
evaluation scores) and the grid rows are formatted here, by hand; membership is a set of tuples.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import gradscope
from gradscope.cli.app import app
from gradscope.models import SeqModel
from gradscope.tasks import make_task
from tests.helpers.runs import DEFAULT_CORE

ITERATIONS, BATCH = 30, 64
COMMON = ["--core", DEFAULT_CORE, "--hidden-size", "8", "--embed-size", "4", "--iterations", str(ITERATIONS), "--batch-size",
          str(BATCH), "--checkpoint-every", "15", "--log-every", "15", "--seed", "3", "--quiet"]

# Each task at a size whose sequences are few (n_patterns in brackets), so collisions are common.
TASKS = {
    "reverse": ["--task", "reverse", "--vocab-size", "3", "--length", "3", "--distribution", "uniform",
                "--heldout-size", "13"],  # 27
    "reverse-dual-grid": ["--task", "reverse", "--vocab-size", "4", "--length", "3", "--distribution", "dual",
                          "--rarity", "0.5", "--heldout-size", "16", "--grid-per-cell", "2"],  # 64, + 24 grid rows
    "reverse-variable": ["--task", "reverse-variable", "--vocab-size", "2", "--length", "3", "--min-length", "2",
                         "--distribution", "uniform", "--heldout-size", "6"],  # 4 + 8
    "sort": ["--task", "sort", "--vocab-size", "3", "--length", "3", "--distribution", "uniform", "--heldout-size", "13"],  # 27
    "delayed-sum": ["--task", "delayed-sum", "--vocab-size", "2", "--length", "3", "--distribution", "uniform",
                    "--heldout-size", "16"],  # 2^6
    "predecessor": ["--task", "predecessor", "--vocab-size", "3", "--length", "3", "--distribution", "uniform",
                    "--heldout-size", "6"],  # 3! · 2
    "copy": ["--task", "copy", "--vocab-size", "2", "--length", "3", "--hold-min", "0", "--hold-max", "1",
             "--distribution", "uniform", "--heldout-size", "8"],  # 2^3 · 2
}


def _record_training_inputs(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Every input batch a SeqModel sees while training (train mode, gradients on)."""
    seen: list[torch.Tensor] = []
    forward = SeqModel.forward

    def recording(self: SeqModel, tokens: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            seen.append(tokens.detach().cpu().clone())
        return forward(self, tokens)

    monkeypatch.setattr(SeqModel, "forward", recording)
    return seen


def _rows(x: torch.Tensor) -> set[tuple[int, ...]]:
    return {tuple(r) for r in x.tolist()}


def _heldout_rows(run: Path) -> tuple[set[tuple[int, ...]], set[tuple[int, ...]]]:
    """(uniform held-out input rows, grid rows as model inputs) of the run's latest checkpoint. Grid
    sequences (…, L) become inputs [x_1 … x_L, query × L] (the reverse layout of SPEC §3), built here."""
    loaded = gradscope.load(run)
    uniform = _rows(loaded.heldout.uniform.inputs)
    grid: set[tuple[int, ...]] = set()
    if loaded.heldout.grid is not None:
        raw = loaded.heldout.grid.reshape(-1, loaded.heldout.grid.shape[-1])  # (2·2·N·L, L)
        query = make_task(loaded.config.task).query
        grid = _rows(torch.cat([raw, torch.full_like(raw, query)], dim=1))
    return uniform, grid


@pytest.mark.parametrize("task", list(TASKS))
def test_training_batches_never_contain_a_heldout_or_grid_row(task: str, runner: CliRunner, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _record_training_inputs(monkeypatch)
    run = tmp_path / "run"
    if task == "reverse-dual-grid":  # also across a stop and a resume (the excluder is rebuilt from the checkpoint)
        first = runner.invoke(app, ["train", "-o", str(run), *COMMON, *TASKS[task], "--stop-after", "12"])
        assert first.exit_code == 0, first.stderr
        result = runner.invoke(app, ["train", "--resume", str(run), "--quiet"])
    else:
        result = runner.invoke(app, ["train", "-o", str(run), *COMMON, *TASKS[task]])
    assert result.exit_code == 0, result.stderr
    trained = torch.cat(seen)
    assert trained.shape[0] == ITERATIONS * BATCH, "the recorder did not see every training batch"
    uniform, grid = _heldout_rows(run)
    assert len(uniform) == gradscope.load(run).config.task.heldout_size
    assert bool(grid) == (task == "reverse-dual-grid")
    rows = [tuple(r) for r in trained.tolist()]
    in_uniform = sum(r in uniform for r in rows)
    in_grid = sum(r in grid for r in rows)
    assert in_uniform == 0 and in_grid == 0, f"{task}: {in_uniform} training rows are held-out rows, {in_grid} grid rows"
    # the check has power: the same number of rows drawn without the exclusion hits both sets often
    cfg = gradscope.load(run).config.task
    free = make_task(cfg).sample(ITERATIONS * BATCH, torch.Generator().manual_seed(0)).inputs
    free_rows = [tuple(r) for r in free.tolist()]
    assert sum(r in uniform for r in free_rows) > 50
    if grid:
        assert sum(r in grid for r in free_rows) > 50
