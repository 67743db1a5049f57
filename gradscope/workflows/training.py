"""`gradscope train` from Python: a new run from a preset and the run's settings, a resumed run, or a vocabulary
extension, chosen by :class:`~gradscope.workflows.options.TrainOptions` and planned (every rule between the
options checked) before anything is written. The command is a shell over :func:`train_run`: it parses the flags,
draws the progress bar and prints the held-out table."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradscope.config import RunConfig
from gradscope.errors import check
from gradscope.fields import leave_out, with_overrides
from gradscope.presets import build_config, check_setting_names, settings
from gradscope.train.extend import extension_config
from gradscope.train.loop import StepCallback, is_run_dir, read_run_config, train
from gradscope.workflows.options import TrainOptions

RUNS = Path("runs")  # where a run without -o/out goes, under the working directory
PRESET = TrainOptions.__dataclass_fields__["preset"].default  # the preset a new run starts from unless told


@dataclass(frozen=True)
class TrainPlan:
    """What :func:`train_run` will do: train ``config`` in ``run_dir`` (a new run, or ``resume`` it; an extension
    of the checkpoint ``extend_from``), stopping after ``stop_after`` iterations of this call when given."""

    config: RunConfig
    run_dir: Path
    resume: bool = False
    extend_from: Path | None = None
    stop_after: int | None = None


@dataclass(frozen=True)
class TrainRun:
    """A finished (or stopped) call of :func:`train_run`: where, with what, and the held-out evaluation (an empty
    dict when ``stop_after`` stopped it early: continue with ``resume=run_dir``)."""

    run_dir: Path
    config: RunConfig
    result: dict[str, Any]


def default_run_dir(cfg: RunConfig, label: str, root: Path = RUNS) -> Path:
    """``root/<label>-<core>-<pe>-K<K>-s<seed>``, numbered -2, -3… if it already exists (``label``: the preset, or
    ``extend``)."""
    stem = f"{label}-{cfg.model.core}-{cfg.model.pe}-K{cfg.task.vocab_size}-s{cfg.train.seed}"
    path, n = root / stem, 1
    while path.exists():
        n += 1
        path = root / f"{stem}-{n}"
    return path


def extension_run_config(parent: Path, given: dict[str, Any], new_item_share: float | None) -> RunConfig:
    """The config of an extension of ``parent`` to ``given["vocab_size"]`` K' items: the parent's model (no model
    setting may be given), its task with the task settings given applied, and its training with the training
    settings given applied (the Adam betas stay the parent's)."""
    check_setting_names(given)  # as a new run's (build_config)
    known = settings()
    fixed = sorted(k for k in given if k in known and known[k].section in ("model", "core"))
    check(not fixed, leave_out(fixed, "an extension keeps its parent's architecture"))
    check("vocab_size" in given, "vocab_size: give the extended vocabulary size K' (larger than the checkpoint's)")
    betas = [k for k in ("beta1", "beta2") if k in given]
    check(not betas, leave_out(betas, "an extension keeps its parent's Adam betas"))
    task = {known[k].field: v for k, v in given.items() if k in known and known[k].section == "task" and k != "vocab_size"}
    train_settings = {known[k].field: v for k, v in given.items() if k in known and known[k].section == "train"}
    return extension_config(parent, given["vocab_size"], new_item_share=new_item_share, train=train_settings, task=task)


def plan_training(out: str | Path | None, opts: TrainOptions, run_settings: dict[str, Any]) -> TrainPlan:
    """The run ``opts`` asks for, checked before anything is written: ``opts.resume``, that run directory with its
    own configuration (no setting and no ``out`` may be given); ``opts.extend_from``, an extension
    (:func:`extension_run_config`); else a new run, ``opts.preset`` with ``run_settings`` applied
    (:func:`gradscope.presets.build_config`). ``out`` None: :func:`default_run_dir`. A setting given as None is
    left out (the preset's value)."""
    given = {k: v for k, v in run_settings.items() if v is not None}
    given.update({k: v for k, v in (("beta1", opts.beta1), ("beta2", opts.beta2)) if v is not None})
    named = [*given, *(["max_length"] if opts.max_length is not None else [])]  # the settings as the caller named them
    if opts.max_length is not None:
        check(given.get("length") in (None, opts.max_length),
              f"max_length/length: got {opts.max_length} and {given.get('length')}; they name the same setting "
              f"(give one)")
        given["length"] = opts.max_length
    out = None if out is None else Path(out)
    preset = ["preset"] if opts.preset != PRESET else []  # a resumed run or an extension starts from no preset
    if opts.resume is not None:
        extra = sorted([*named, *preset, *(k for k in ("extend_from", "new_item_share") if getattr(opts, k) is not None)])
        extra += ["out"] if out is not None else []
        check(not extra, leave_out(extra, "a resumed run keeps its own configuration and directory"))
        check(is_run_dir(opts.resume), f"resume: {opts.resume} is not a gradscope run directory (no config.json)")
        return TrainPlan(read_run_config(opts.resume), opts.resume, resume=True, stop_after=opts.stop_after)
    if opts.extend_from is not None:
        check(not preset, leave_out(preset, "an extension starts from its parent's configuration"))
        cfg = extension_run_config(opts.extend_from, given, opts.new_item_share)
        return TrainPlan(cfg, out or default_run_dir(cfg, "extend"), extend_from=opts.extend_from,
                         stop_after=opts.stop_after)
    check(opts.new_item_share is None, "new_item_share: only an extension of a checkpoint has new items; leave it out")
    cfg = build_config(opts.preset, given)
    return TrainPlan(cfg, out or default_run_dir(cfg, opts.preset), stop_after=opts.stop_after)


def train_run(out: str | Path | None = None, *, opts: TrainOptions | None = None,
              on_step: StepCallback | None = None, command: str = "", **overrides: Any) -> TrainRun:
    """Train one run, as `gradscope train` does: ``overrides`` are :class:`TrainOptions` fields (``preset``,
    ``resume``, ``extend_from``, ``stop_after``, …) and the run's settings (``core``, ``hidden_size``,
    ``vocab_size``, …, each named as its config field and flag); ``out`` the run directory (None: under
    ``runs/``). ``on_step(iteration, log)`` after every iteration. Everything is checked before the directory is
    touched (:func:`plan_training`, then :func:`gradscope.train.loop.train`)."""
    names = {f.name for f in dataclasses.fields(TrainOptions)}
    opts = with_overrides(TrainOptions, opts, {k: v for k, v in overrides.items() if k in names}, "train_run")
    return run_plan(plan_training(out, opts, {k: v for k, v in overrides.items() if k not in names}),
                    on_step=on_step, command=command)


def run_plan(plan: TrainPlan, *, on_step: StepCallback | None = None, command: str = "") -> TrainRun:
    """Carry out ``plan`` (:func:`plan_training`): train, resume or extend its run (``command``: recorded with
    the run)."""
    result = train(plan.config, plan.run_dir, resume=plan.resume, stop_after=plan.stop_after, on_step=on_step,
                   command=command, extend_from=plan.extend_from)
    return TrainRun(plan.run_dir, plan.config, result)

