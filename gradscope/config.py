"""Frozen configuration dataclasses for models, tasks and training.

Every config validates itself on construction (raising :class:`GradscopeError` naming the field)
and round-trips through ``asdict`` / :func:`from_dict`, which is how checkpoints and zarr
attributes carry them.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from gradscope.errors import GradscopeError, check
from gradscope.fields import from_dict
from gradscope.models.config import MAX_SIZE, PE_COMBINE, ModelConfig, integer, real, shown, text
from gradscope.models.pe import PE_TYPES
from gradscope.models.registry import CORES
from gradscope.tasks.registry import TASKS

DISTRIBUTIONS = ("uniform", "dual")
MAX_LENGTH = 2**20  # a task's L (and copy's hold phase): the held-out grid is built position by position
MAX_COUNT = 2**62  # iterations and cadences
MAX_SEED = 2**63 - 1
DEVICE = re.compile(r"auto|(cpu|cuda|mps|xpu)(:\d+)?")
__all__ = ["CORES", "DISTRIBUTIONS", "PE_COMBINE", "PE_TYPES", "TASKS", "ModelConfig", "RunConfig", "TaskConfig",
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
    corpus: str = ""  # lm only: the corpus directory (gradscope corpus prepare)
    corpus_sha256: str = ""  # lm only: the sha256 of that corpus's manifest (its identity)

    def __post_init__(self) -> None:
        text("task", self.name, list(TASKS))
        text("distribution", self.distribution, DISTRIBUTIONS)
        for name in ("vocab_size", "heldout_size", "grid_per_cell"):
            integer(name, getattr(self, name), 1, MAX_SIZE)
        for name, low in (("length", 1), ("min_length", 1), ("hold_min", 0), ("hold_max", 0)):
            integer(name, getattr(self, name), low, MAX_LENGTH)
        check(self.vocab_size >= 2, f"vocab_size: got {self.vocab_size}; need at least 2 tokens")
        real("rarity", self.rarity, 0.0, 1.0, above=True, below=True)
        for name in ("corpus", "corpus_sha256"):
            check(isinstance(getattr(self, name), str), f"{name}: got {shown(getattr(self, name))}; expected text")
        TASKS[self.name].check_config(self)  # the settings only this task uses


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
        for name in ("iterations", "checkpoint_every", "log_every"):
            integer(name, getattr(self, name), 1, MAX_COUNT)
        integer("batch_size", self.batch_size, 1, MAX_SIZE)
        integer("warmup", self.warmup, 0, MAX_COUNT)
        integer("seed", self.seed, 0, MAX_SEED)
        integer("threads", self.threads, 0, 4096)
        real("lr", self.lr, 0.0, above=True)
        real("eps", self.eps, 0.0, above=True)
        real("clip", self.clip, 0.0)  # 0 disables clipping
        check(isinstance(self.betas, (tuple, list)) and len(self.betas) == 2,
              f"betas: got {shown(self.betas)}; need two values in [0, 1)")
        for b in self.betas:
            real("betas", b, 0.0, 1.0, below=True)
        object.__setattr__(self, "betas", tuple(self.betas))
        check(isinstance(self.device, str) and DEVICE.fullmatch(self.device) is not None,
              f"device: got {shown(self.device)}; use auto, cpu, cuda or cuda:N")


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one training run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        for name, kind in (("model", ModelConfig), ("task", TaskConfig), ("train", TrainConfig)):
            check(isinstance(getattr(self, name), kind),
                  f"run config: {name} is a {type(getattr(self, name)).__name__}; expected a {kind.__name__}")

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
            raise GradscopeError(f"run config: malformed ({type(exc).__name__}: "
                                 f"{(str(exc).splitlines() or [''])[0][:160]})") from None
