"""Small real runs for the tests: a config that trains in well under a second, and the last logged
iteration of a run (formerly in conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from gradscope.models import core_class


def small_run(core: str = "gru", pe: str = "none", iterations: int = 20, **task: object) -> RunConfig:
    """A run that trains in well under a second."""
    task_cfg = TaskConfig(**{"name": "reverse", "vocab_size": 8, "length": 4, "heldout_size": 64,
                             "distribution": "dual", "grid_per_cell": 2, **task})
    return RunConfig(
        model=ModelConfig(core=core, vocab_size=task_cfg.vocab_size, embed_size=8, hidden_size=16, pe=pe,
                          max_len=16, core_config=dict(core_class(core).tiny_config)),
        task=task_cfg,
        train=TrainConfig(iterations=iterations, batch_size=16, lr=1e-2, warmup=3, checkpoint_every=5,
                          log_every=5, seed=7),
    )


def logged_iteration(run: Path) -> int:
    """The last iteration in a run's metrics.jsonl (0 if none yet; a line being written is skipped)."""
    last = 0
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    for line in lines:
        try:
            last = json.loads(line)["iteration"]
        except (json.JSONDecodeError, KeyError):
            pass
    return last
