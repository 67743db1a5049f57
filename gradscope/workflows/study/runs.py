"""A study's runs and where they go: the (core, PE, seed) runs of `gradscope reproduce` and `gradscope
sweep`, planned from a scale's configurations and checked for memory before anything starts, and the
study directory's layout (:class:`Layout`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from gradscope.config import RunConfig
from gradscope.errors import check
from gradscope.guard import check_bytes, safe_component
from gradscope.models import SeqModel, core_class
from gradscope.models.pe import pe_numbers
from gradscope.presets import SCALES, scale_configs
from gradscope.tasks import make_task
from gradscope.tasks.registry import probe_tasks
from gradscope.fields import as_seed
from gradscope.workflows.common import conditions_for
from gradscope.workflows.stability import StabilityOptions, result_bytes
from gradscope.workflows.study.options import StudyOptions

PES = ("none", "sinusoidal")


@dataclass(frozen=True)
class PlannedRun:
    name: str  # <core>-<pe>-s<seed>
    config: RunConfig

    def __post_init__(self) -> None:
        safe_component(self.name, "run name")  # it names a directory under the study's root

    @property
    def tokens(self) -> int:
        """Tokens processed in training (batch × sequence length × iterations)."""
        t = self.config.train
        return t.iterations * t.batch_size * make_task(self.config.task).total_len

    @property
    def parameters(self) -> int:
        """Trainable parameters, counted on the meta device (nothing is allocated)."""
        with torch.device("meta"):
            model = SeqModel(self.config.model)
        return sum(p.numel() for p in model.parameters())

    @property
    def memory_bytes(self) -> int:
        """A lower bound of training memory, from the config alone (nothing is built), so a refusal
        is never a false alarm: float32 weights (at least the embedding, a position table, one H × H
        recurrent matrix per layer and the readout), their gradients and two Adam moments; one batch's inputs, states
        of every layer and logits at every step (autograd keeps more); the held-out data (int64)."""
        m, t, task = self.config.model, self.config.train, self.config.task
        weights = (m.vocab_size + 1) * m.embed_size + m.num_layers * m.hidden_size ** 2 + m.hidden_size * m.vocab_size
        weights += pe_numbers(m.pe, m.embed_size, m.max_len)  # a position table
        steps = 2 * task.length  # every task reads its input, then answers (at least as long)
        own = core_class(m.core).token_floats(m.hidden_size, m.core_config)  # e.g. a selective scan's state
        width = m.embed_size + (2 * m.hidden_size + own) * m.num_layers + m.vocab_size
        grid = 4 * task.grid_per_cell * task.length * task.length
        return 4 * (4 * weights + t.batch_size * steps * width) + 8 * steps * (2 * task.heldout_size + grid)

    @property
    def train_flops(self) -> float:
        """≈ 6 × parameters × tokens (forward + backward), the usual dense-model estimate."""
        return 6.0 * self.parameters * self.tokens


def plan_runs(scale: str, models: list[str], seeds: list[int], iterations: int | None = None,
              pes: tuple[str, ...] = PES) -> list[PlannedRun]:
    """Every (model, PE, seed) run of the study, configured from :func:`scale_configs`."""
    check(scale in SCALES, f"scale: got {scale!r}; valid scales are {', '.join(SCALES)}")
    bases = scale_configs(scale)
    check(bool(models), f"models: give at least one of {', '.join(bases)}")
    for m in models:
        check(m in bases, f"models: got {m!r}; valid models are {', '.join(bases)}")
    check(bool(seeds), "seeds: give at least one seed")
    seeds = [as_seed(s, "seeds") for s in seeds]
    check(len(set(seeds)) == len(seeds), f"seeds: got {seeds}; a seed given twice would train the same run twice")
    check(len(set(models)) == len(models), f"models: got {models}; a model given twice would train the same runs twice")
    check(iterations is None or iterations > 0, f"iterations: got {iterations}; it must be positive")
    runs = []
    for core in models:
        base = bases[core]
        task = make_task(base.task)
        model = dataclasses.replace(base.model, vocab_size=task.num_classes, max_len=task.total_len)
        train_cfg = base.train
        if iterations is not None:
            every = max(1, iterations // 4)
            train_cfg = dataclasses.replace(train_cfg, iterations=iterations, checkpoint_every=every,
                                            log_every=max(1, min(train_cfg.log_every, every)),
                                            warmup=min(train_cfg.warmup, iterations // 10))
        for pe in pes:
            for seed in seeds:
                cfg = RunConfig(model=dataclasses.replace(model, pe=pe), task=base.task,
                                train=dataclasses.replace(train_cfg, seed=seed))
                runs.append(PlannedRun(f"{core}-{pe}-s{seed}", cfg))
    return runs


def plan_synthetic_study(options: StudyOptions, out: Path) -> tuple[list[PlannedRun], StabilityOptions]:
    """The synthetic study's runs (``options.models`` × PEs × ``options.seeds``, by default gru, lstm, s4d and
    seeds 1, 2, 3) and the stability options they share (``options.triplets``); ``out`` is unused (its runs
    need no files prepared)."""
    runs = plan_runs(options.scale, list(options.models or ("gru", "lstm", "s4d")), list(options.seeds or (1, 2, 3)),
                     options.iterations)
    return runs, StabilityOptions(triplets=options.triplets)


def check_run_sizes(r: PlannedRun, stability: StabilityOptions | None = None, checkpoints: int | None = None) -> None:
    """Refuse a planned run (before it starts) whose training, or whose stability analysis over
    ``checkpoints`` checkpoints (None: every one it saves), would not fit in memory."""
    check_bytes(min(r.memory_bytes, 1 << 100), f"{r.name}: training (hidden {r.config.model.hidden_size}, vocab "
                                f"{r.config.model.vocab_size}, batch {r.config.train.batch_size})")
    if stability is not None and r.config.task.name in probe_tasks():
        t = r.config.train
        saved = checkpoints if checkpoints is not None else -(-t.iterations // t.checkpoint_every)
        conditions = len(conditions_for(r.config.task, stability.target_freq, stability.disturbant))
        check_bytes(min(result_bytes(conditions * stability.triplets, r.config.task.length, saved,
                                     min(stability.sv, r.config.model.hidden_size)), 1 << 100), "triplets")


@dataclass(frozen=True)
class Layout:
    """Where a study puts its outputs."""

    root: Path

    def run(self, r: PlannedRun) -> Path:
        return self.root / "runs" / r.name

    def accuracy(self, r: PlannedRun) -> Path:
        return self.root / "stores" / f"accuracy-{r.name}.zarr"

    def stability(self, r: PlannedRun) -> Path:
        return self.root / "stores" / f"stability-{r.name}.zarr"

    @property
    def summary_accuracy(self) -> Path:
        return self.root / "summary-accuracy.zarr"

    @property
    def summary_stability(self) -> Path:
        return self.root / "summary-stability.zarr"

    @property
    def report(self) -> Path:
        return self.root / "report.html"
