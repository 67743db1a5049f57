"""Small real runs for the tests: a config that trains in well under a second, and the last logged
iteration of a run (formerly in conftest.py); and the cores a test takes when it needs "some core", chosen
from the registry by what they are, never by name (issue #39: no test picks a core by name except its own)."""

from __future__ import annotations

import json
from pathlib import Path

from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from gradscope.models import CORES, core_class

DEFAULT_CORE: str = ModelConfig.__dataclass_fields__["core"].default  # what a run gets when no core is named
# a second gated recurrent core (real state, several gate terms), other than the default
OTHER_CORE: str = next(n for n, c in CORES.items()
                       if n != DEFAULT_CORE and not c.complex_state and len(c.gate_names) > 1)
COMPLEX_CORE: str = next(n for n, c in CORES.items() if c.complex_state)  # a core with a complex state


def small_run(core: str = DEFAULT_CORE, pe: str = "none", iterations: int = 20, **task: object) -> RunConfig:
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


# the [settings] of a sweep point small enough to train in seconds on one core (a GRU of 16 units on 8 tokens of
# length 4); a spec adds its iterations, checkpoints and axes
TINY_POINT_SETTINGS = """hidden_size = 16
embed_size = 8
vocab_size = 8
length = 4
heldout_size = 64
grid_per_cell = 2
batch_size = 16
"""
