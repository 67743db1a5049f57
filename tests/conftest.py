"""Shared fixtures: small configs and a CLI runner that separates stdout and stderr."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig

torch.set_num_threads(1)  # the suite shares 2 cores with whatever else runs; 1 thread is faster here


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def small_run(core: str = "gru", pe: str = "none", iterations: int = 20, **task: object) -> RunConfig:
    """A run that trains in well under a second."""
    task_cfg = TaskConfig(**{"name": "reverse", "vocab_size": 8, "length": 4, "heldout_size": 64,
                             "distribution": "dual", "grid_per_cell": 2, **task})
    return RunConfig(
        model=ModelConfig(core=core, vocab_size=task_cfg.vocab_size, embed_size=8, hidden_size=16, pe=pe,
                          max_len=16, state_size=4),
        task=task_cfg,
        train=TrainConfig(iterations=iterations, batch_size=16, lr=1e-2, warmup=3, checkpoint_every=5,
                          log_every=5, seed=7),
    )
