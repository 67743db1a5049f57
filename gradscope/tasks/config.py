"""The task's frozen configuration (as ModelConfig lives in models/config.py); the shared fields are
checked here, the fields only one task uses by that task (``Task.check_config``, via the registry)."""

from __future__ import annotations

from dataclasses import dataclass

from gradscope.errors import check
from gradscope.models.config import MAX_SIZE, integer, real, text
from gradscope.tasks.registry import TASKS

DISTRIBUTIONS = ("uniform", "dual")
MAX_LENGTH = 2**20  # a task's L (and copy's hold phase): the held-out grid is built position by position


@dataclass(frozen=True)
class TaskConfig:
    """A synthetic task (SPEC §3). ``length`` is L (the maximum L for ``reverse-variable``; the
    number of tokens to remember for ``copy``)."""

    name: str = "reverse"
    vocab_size: int = 64
    length: int = 64
    min_length: int = 32  # reverse-variable only
    distribution: str = "uniform"
    rarity: float = 0.125  # dual only: probability that a position holds a Rare token
    heldout_size: int = 1024
    grid_per_cell: int = 16  # dual + reverse only: N sequences per (target, disturbant, position)
    hold_min: int = 60  # copy only
    hold_max: int = 100  # copy only

    def __post_init__(self) -> None:
        text("task", self.name, list(TASKS))
        text("distribution", self.distribution, DISTRIBUTIONS)
        for name in ("vocab_size", "heldout_size", "grid_per_cell"):
            integer(name, getattr(self, name), 1, MAX_SIZE)
        for name, low in (("length", 1), ("min_length", 1), ("hold_min", 0), ("hold_max", 0)):
            integer(name, getattr(self, name), low, MAX_LENGTH)
        check(self.vocab_size >= 2, f"vocab_size: got {self.vocab_size}; need at least 2 tokens")
        real("rarity", self.rarity, 0.0, 1.0, above=True, below=True)
        TASKS[self.name].check_config(self)  # the settings only this task uses
