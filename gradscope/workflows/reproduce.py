"""`gradscope reproduce`: train × seeds → accuracy → stability over checkpoints → summarize → report.

Resumable: every step writes its output atomically, so a step whose output exists is done and is
skipped on a re-run; a run directory without ``eval.json`` is resumed from its last checkpoint.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import xarray as xr

from gradscope.config import RunConfig
from gradscope.errors import check
from gradscope.models import SeqModel
from gradscope.presets import SCALES
from gradscope.tasks import make_task
from gradscope.train.checkpoint import checkpoint_iteration, resolve_checkpoints
from gradscope.train.loop import EVAL_FILE, discard_unstarted, is_run_dir, read_run_config, resumable, train
from gradscope.workflows.accuracy import AccuracyOptions, run_accuracy
from gradscope.workflows.stability import StabilityOptions, run_stability

PES = ("none", "sinusoidal")


@dataclass(frozen=True)
class PlannedRun:
    name: str  # <core>-<pe>-s<seed>
    config: RunConfig

    @property
    def tokens(self) -> int:
        """Tokens processed in training (batch × sequence length × iterations)."""
        t = self.config.train
        return t.iterations * t.batch_size * make_task(self.config.task).total_len

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in SeqModel(self.config.model).parameters())

    @property
    def train_flops(self) -> float:
        """≈ 6 × parameters × tokens (forward + backward), the usual dense-model estimate."""
        return 6.0 * self.parameters * self.tokens


def plan_runs(scale: str, models: list[str], seeds: list[int], iterations: int | None = None,
              pes: tuple[str, ...] = PES) -> list[PlannedRun]:
    """Every (model, PE, seed) run of the study, configured from ``SCALES[scale]``."""
    check(scale in SCALES, f"scale: got {scale!r}; valid scales are {', '.join(SCALES)}")
    for m in models:
        check(m in SCALES[scale], f"models: got {m!r}; valid models are {', '.join(SCALES[scale])}")
    check(bool(seeds), "seeds: give at least one seed")
    check(iterations is None or iterations > 0, f"iterations: got {iterations}; it must be positive")
    runs = []
    for core in models:
        base = SCALES[scale][core]
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


Event = Callable[[str, str], None]  # (step, message)


def train_step(r: PlannedRun, layout: Layout, on_step: Callable[[int, dict | None], None] | None = None,
               command: str = "") -> str:
    """Train (or resume, or skip) one run; returns what was done."""
    run_dir = layout.run(r)
    resume = is_run_dir(run_dir)
    if resume:
        check(read_run_config(run_dir) == r.config, f"{run_dir}: this run was started with a different "
                                                    f"configuration than the plan; move it away or choose another `out`")
    if (run_dir / EVAL_FILE).exists():
        return "done earlier"
    if resume and not resumable(run_dir):  # killed before its first checkpoint
        discard_unstarted(run_dir)
        resume = False
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    train(r.config, run_dir, resume=resume, on_step=on_step, command=command)
    return "resumed" if resume else "trained"


def accuracy_step(r: PlannedRun, layout: Layout, command: str = "", opts: AccuracyOptions = AccuracyOptions(),
                  checkpoints: str | tuple[int, ...] = "all") -> "xr.Dataset | None":
    """The accuracy store of one run (at the chosen checkpoints), or None when it exists already."""
    if layout.accuracy(r).exists():
        return None
    return run_accuracy(select_checkpoints(layout.run(r), checkpoints), opts, command=command,
                        device_label=opts.device).to_xarray()


def select_checkpoints(run_dir: Path, which: str | tuple[int, ...]) -> list[Path]:
    """The run's checkpoints to analyse: "all", "last", or those at the given iterations."""
    found = resolve_checkpoints(run_dir)
    if which == "all":
        return found
    if which == "last":
        return found[-1:]
    by_iteration = {checkpoint_iteration(p): p for p in found}
    missing = [i for i in which if i not in by_iteration]
    check(not missing, f"checkpoints: {run_dir} has no checkpoint at iteration(s) "
                       f"{', '.join(map(str, missing))}; it has {', '.join(map(str, by_iteration))}")
    return [by_iteration[i] for i in which]


def stability_step(r: PlannedRun, layout: Layout, opts: StabilityOptions, command: str = "",
                   checkpoints: str | tuple[int, ...] = "all") -> "xr.Dataset | None":
    """The stability store of one run (``opts``' conditions at the chosen checkpoints), or None
    when it exists."""
    if layout.stability(r).exists():
        return None
    return run_stability(select_checkpoints(layout.run(r), checkpoints), opts, command=command,
                         device_label=opts.device).to_xarray()
