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
from gradscope.fields import DEFAULT_DEVICE, MAX_SEED, bounded, check_fields, from_dict, option, real, shown, text
from gradscope.models.config import MAX_SIZE, PE_COMBINE, ModelConfig
from gradscope.models.pe import PE_TYPES
from gradscope.models.registry import CORES
from gradscope.tasks.config import DISTRIBUTIONS, TaskConfig
from gradscope.tasks.registry import TASKS

MAX_ITERATIONS = 2**62  # iterations and cadences (counts of options: workflows.common.MAX_COUNT)
DECODINGS = ("none", "teacher", "autoregressive")  # TrainConfig.decoding
DECODING = "none"  # the output phase reads query tokens unless told: the standard (non-feedback) model
DEVICE = re.compile(r"auto|(cpu|cuda|mps|xpu)(:\d+)?")
__all__ = ["CORES", "DECODINGS", "DISTRIBUTIONS", "ExtendConfig", "PE_COMBINE", "PE_TYPES", "TASKS", "ModelConfig",
           "RunConfig", "TaskConfig", "TrainConfig", "from_dict"]

FLOAT32_MAX = 3.4028234663852886e38  # a float32 step size or epsilon beyond this is inf


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimisation (docs/definitions.md §3): Adam, linear warm-up then cosine to 0, grad-norm clipping."""

    # option(...): a setting of `gradscope train --<field>` and of sweep specs (betas: --beta1 and --beta2)
    iterations: int = option(300_000, "Training iterations.", low=1, high=MAX_ITERATIONS)
    batch_size: int = option(512, "Sequences per batch.", low=1, high=MAX_SIZE)
    # Adam scales float32 weights by lr and eps: beyond float32's largest they are inf
    lr: float = option(1e-3, "Peak learning rate (linear warm-up, then cosine to 0).", low=0.0, high=FLOAT32_MAX,
                       exclusive="low")
    warmup: int = option(1000, "Warm-up iterations.", low=0, high=MAX_ITERATIONS)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = option(1e-8, "Adam ε (reference code: 1e-9).", low=0.0, high=FLOAT32_MAX, exclusive="low")
    clip: float = option(1.0, "Gradient-norm clip (0 disables).", low=0.0)
    checkpoint_every: int = option(5000, "Write a checkpoint every N iterations.", low=1, high=MAX_ITERATIONS)
    log_every: int = option(100, "Log metrics every N iterations.", low=1, high=MAX_ITERATIONS)
    seed: int = option(111, "Seed for initialisation, held-out data and batches.", low=0, high=MAX_SEED)
    device: str = option(DEFAULT_DEVICE, "auto (cuda when present), cpu, cuda or cuda:N.")
    threads: int = option(0, "torch CPU threads (0 = torch's default).", low=0, high=4096)  # torch intra-op threads
    # How the output phase is fed (paper App. B.2): none = query tokens (the standard model); teacher
    # = the previous ground-truth token (a feedback model trained teacher-forced, as the paper did);
    # autoregressive = the model's own previous prediction (free-running training).
    decoding: str = option(DECODING, "Output-phase input: none (query tokens), or a feedback model fed the previous "
                                   "token: teacher (ground truth, as the paper trained) or autoregressive (its own "
                                   "prediction).")

    def __post_init__(self) -> None:
        check_fields(self, strict=True)  # the ranges declared on the fields
        check(isinstance(self.betas, (tuple, list)) and len(self.betas) == 2,
              f"betas: got {shown(self.betas)}; need two values in [0, 1)")
        for b in self.betas:
            real("betas", b, 0.0, 1.0, below=True)
        object.__setattr__(self, "betas", tuple(self.betas))
        check(isinstance(self.device, str) and DEVICE.fullmatch(self.device) is not None,
              f"device: got {shown(self.device)}; use auto, cpu, cuda or cuda:N")
        text("decoding", self.decoding, DECODINGS)


SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, kw_only=True)
class ExtendConfig:
    """Provenance of a vocabulary-extension run (paper §4.2): the parent checkpoint (file name,
    sha256 of its bytes, iterations it was trained for) and the parameters kept frozen, as names
    (``core.*``-style full names, or ``name[a:b]`` for rows a … b−1 of a matrix)."""

    parent: str
    parent_sha256: str
    parent_iteration: int = bounded(dataclasses.MISSING, low=0, high=MAX_ITERATIONS)
    frozen: tuple[str, ...]

    def __post_init__(self) -> None:
        check(isinstance(self.parent, str) and bool(self.parent), f"extend parent: got {shown(self.parent)}")
        check(isinstance(self.parent_sha256, str) and SHA256.fullmatch(self.parent_sha256) is not None,
              f"extend parent_sha256: got {shown(self.parent_sha256)}; expected 64 lowercase hex digits")
        check_fields(self, strict=True)  # parent_iteration's range
        check(isinstance(self.frozen, (tuple, list)) and all(isinstance(f, str) for f in self.frozen),
              "extend frozen: expected a list of parameter names")
        object.__setattr__(self, "frozen", tuple(self.frozen))


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything that defines one training run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    extend: ExtendConfig | None = None  # a vocabulary-extension run: its parent and frozen parameters

    def __post_init__(self) -> None:
        for name, kind in (("model", ModelConfig), ("task", TaskConfig), ("train", TrainConfig)):
            check(isinstance(getattr(self, name), kind),
                  f"run config: {name} is a {type(getattr(self, name)).__name__}; expected a {kind.__name__}")
        check(self.extend is None or isinstance(self.extend, ExtendConfig),
              f"run config: extend is a {type(self.extend).__name__}; expected an ExtendConfig or None")
        feedback = self.train.decoding != "none"
        check(self.model.feedback == feedback,
              f"decoding: got {self.train.decoding!r}, but the model {'has' if self.model.feedback else 'has no'} "
              f"feedback input; a feedback model (feedback=True) trains with decoding teacher or autoregressive")
        if feedback:
            check(TASKS[self.task.name].probes and self.model.inputs == "tokens",
                  f"decoding: got {self.train.decoding!r}; feedback decoding needs a token task whose output phase "
                  f"reads query tokens ({', '.join(n for n, c in TASKS.items() if c.probes and c.inputs == 'tokens')})")
        check(self.extend is None or self.task.old_items > 0,
              "extend: an extension run's task must state its old items (old_items > 0)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "RunConfig":
        try:
            extend = data.get("extend")
            return RunConfig(
                model=ModelConfig.from_dict(data["model"]),
                task=from_dict(TaskConfig, data["task"]),
                train=from_dict(TrainConfig, data["train"]),
                extend=None if extend is None else from_dict(ExtendConfig, extend),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise GradscopeError(f"run config: malformed ({type(exc).__name__}: "
                                 f"{(str(exc).splitlines() or [''])[0][:160]})") from None
