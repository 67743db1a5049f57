"""Frozen configuration dataclasses for models, tasks and training.

Every config validates itself on construction (raising :class:`GradscopeError` naming the field)
and round-trips through ``asdict`` / :func:`from_dict`, which is how checkpoints and zarr
attributes carry them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gradscope.errors import GradscopeError, check
from gradscope.fields import from_dict, one_of as _one_of, positive as _positive
from gradscope.models.config import PE_COMBINE, PE_KINDS, ModelConfig
from gradscope.models.registry import CORES

TASKS = ("reverse", "reverse-variable", "sort", "delayed-sum", "predecessor", "copy")
DISTRIBUTIONS = ("uniform", "dual")
__all__ = ["CORES", "DISTRIBUTIONS", "PE_COMBINE", "PE_KINDS", "TASKS", "ModelConfig", "RunConfig", "TaskConfig",
           "TrainConfig", "from_dict"]


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
        _one_of("task", self.name, TASKS)
        _one_of("distribution", self.distribution, DISTRIBUTIONS)
        for name in ("vocab_size", "length", "heldout_size", "grid_per_cell"):
            _positive(name, getattr(self, name))
        check(self.vocab_size >= 2, f"vocab_size: got {self.vocab_size}; need at least 2 tokens")
        check(0.0 < self.rarity < 1.0, f"rarity: got {self.rarity}; it must lie strictly between 0 and 1")
        if self.name == "reverse-variable":
            check(1 <= self.min_length <= self.length,
                  f"min_length: got {self.min_length}; need 1 <= min_length <= length ({self.length})")
        if self.name == "predecessor":
            check(self.length >= 2, f"length: got {self.length}; predecessor needs L >= 2")
            check(self.vocab_size >= self.length,
                  f"vocab_size: got {self.vocab_size}; predecessor needs non-repeating tokens, "
                  f"so vocab_size must be >= length ({self.length})")
        if self.name == "copy":
            check(0 <= self.hold_min <= self.hold_max,
                  f"hold_min/hold_max: got {self.hold_min}/{self.hold_max}; need 0 <= min <= max")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation (SPEC §3): Adam, linear warm-up then cosine to 0, grad-norm clipping."""

    iterations: int = 300_000
    batch_size: int = 512
    lr: float = 1e-3
    warmup: int = 1000
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    clip: float = 1.0
    checkpoint_every: int = 5000
    log_every: int = 100
    seed: int = 111
    device: str = "auto"
    threads: int = 0  # torch intra-op threads; 0 = leave torch's default

    def __post_init__(self) -> None:
        for name in ("iterations", "batch_size", "lr", "checkpoint_every", "log_every", "eps"):
            _positive(name, getattr(self, name))
        check(self.warmup >= 0, f"warmup: got {self.warmup}; it must be >= 0")
        check(self.clip >= 0, f"clip: got {self.clip}; it must be >= 0 (0 disables clipping)")
        check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
              f"betas: got {self.betas}; need two values in [0, 1)")
        check(self.threads >= 0, f"threads: got {self.threads}; it must be >= 0")


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one training run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "RunConfig":
        try:
            return RunConfig(
                model=ModelConfig.from_dict(data["model"]),
                task=from_dict(TaskConfig, data["task"]),
                train=from_dict(TrainConfig, data["train"]),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise GradscopeError(f"run config: malformed ({exc})") from None
