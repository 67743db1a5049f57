"""Frozen configuration dataclasses for models, tasks and training.

Every config validates itself on construction (raising :class:`GradscopeError` naming the field)
and round-trips through ``asdict`` / :func:`from_dict`, which is how checkpoints and zarr
attributes carry them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gradscope.errors import GradscopeError, check

CORES = ("elman", "gru", "lstm", "s4d")
PE_KINDS = ("none", "sinusoidal", "learnable", "random", "dummy")
PE_COMBINE = ("concat", "add")
TASKS = ("reverse", "reverse-variable", "sort", "delayed-sum", "predecessor", "copy")
DISTRIBUTIONS = ("uniform", "dual")


def _one_of(name: str, value: str, valid: tuple[str, ...]) -> None:
    check(value in valid, f"{name}: got {value!r}; valid values are {', '.join(valid)}")


def _positive(name: str, value: float) -> None:
    check(value > 0, f"{name}: got {value}; it must be positive")


@dataclass(frozen=True)
class ModelConfig:
    """A sequence model: embedding (K+1 rows, row K = query token) → PE → core → Linear(H, K)."""

    core: str = "gru"
    vocab_size: int = 64  # K output classes; the embedding has K + 1 rows
    embed_size: int = 512
    hidden_size: int = 512
    num_layers: int = 1
    pe: str = "none"
    pe_combine: str = "concat"
    max_len: int = 128  # positions a learnable/random PE covers (>= total sequence length)
    state_size: int = 64  # S4D state size N (N/2 complex modes)
    dt_min: float = 1e-3
    dt_max: float = 1e-1

    def __post_init__(self) -> None:
        _one_of("core", self.core, CORES)
        _one_of("pe", self.pe, PE_KINDS)
        _one_of("pe_combine", self.pe_combine, PE_COMBINE)
        for name in ("vocab_size", "embed_size", "hidden_size", "num_layers", "max_len", "state_size"):
            _positive(name, getattr(self, name))
        check(self.vocab_size >= 2, f"vocab_size: got {self.vocab_size}; need at least 2 tokens")
        if self.pe == "sinusoidal":
            check(self.embed_size % 2 == 0,
                  f"embed_size: got {self.embed_size}; a sinusoidal PE needs an even size")
        check(self.state_size % 2 == 0,
              f"state_size: got {self.state_size}; S4D needs an even state size (N/2 complex modes)")
        check(0 < self.dt_min <= self.dt_max, f"dt_min/dt_max: got {self.dt_min}/{self.dt_max}")

    @property
    def core_input_size(self) -> int:
        """Width of the vector fed to the core at each step."""
        if self.pe != "none" and self.pe_combine == "concat":
            return 2 * self.embed_size
        return self.embed_size


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


C = TypeVar("C")


def from_dict(cls: type[C], data: dict[str, Any]) -> C:
    """Build config ``cls`` from a plain dict (JSON or checkpoint), rejecting unknown keys."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise GradscopeError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}")
    clean = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return cls(**clean)


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
                model=from_dict(ModelConfig, data["model"]),
                task=from_dict(TaskConfig, data["task"]),
                train=from_dict(TrainConfig, data["train"]),
            )
        except (KeyError, TypeError) as exc:
            raise GradscopeError(f"run config: malformed ({exc})") from None
