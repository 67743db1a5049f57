"""`gradscope reproduce`: train × seeds → accuracy → stability over checkpoints → summarize → report.

Resumable: every step writes its output atomically, so a step whose output exists is done and is
skipped on a re-run; a run directory without ``eval.json`` is resumed from its last checkpoint.

:func:`reproduce` is the whole loop, callable from Python (the command is a thin shell over it):
:class:`StudyOptions` named as the flags, :func:`plan_study` (the runs, checked before anything
starts), :func:`run_study` (train, accuracy and stability per run, then the two summary stores). The
HTML report is drawn at the edge (``gradscope report``, or the command), as every report is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import xarray as xr

from gradscope.fields import CHECKPOINTS
from gradscope.errors import check
from gradscope.files.checkpoint import checkpoint_iteration, resolve_checkpoints
from gradscope.store.io import write_store
from gradscope.store.summary import summary_attrs, summary_dataset, trial_records
from gradscope.models import SeqModel
from gradscope.tasks import make_task
from gradscope.train.loop import (EVAL_FILE, discard_unstarted, is_run_dir, loss_and_correct, read_run_config,
                                  resumable, train)
from gradscope.workflows.accuracy import AccuracyOptions, run_checkpoint_accuracy
from gradscope.workflows.study.extension import study_extension, study_extension_plans
from gradscope.workflows.study.registry import STUDY_PLANS
from gradscope.workflows.study.runs import Layout, PlannedRun, check_run_sizes
from gradscope.workflows.stability import StabilityOptions, run_checkpoint_stability
from gradscope.fields import with_overrides
from gradscope.workflows.study.options import StudyOptions  # declared torch-free
from gradscope.workflows.summarize import SummaryEntry, group_records, summarize_groups

SUMMARY_FIELDS = ("core", "pe")


@dataclass(frozen=True)
class Study:
    """A planned study: its runs (every one checked for memory), the stability options its runs share,
    and its directory's layout."""

    options: StudyOptions
    runs: list[PlannedRun]
    stability: StabilityOptions
    layout: Layout


@dataclass(frozen=True)
class StudyResult:
    """What :func:`run_study` wrote: per kind ("accuracy", "stability") the summary entries over the
    runs' stores, grouped by core and PE (their stores: ``study.layout.summary_<kind>``); the extension
    table, if run."""

    study: Study
    summaries: dict[str, list[SummaryEntry]] = field(default_factory=dict)
    extension: str | None = None


def seconds_per_step(run: PlannedRun) -> float:
    """Measured now: one warm-up and three timed training steps of this configuration on the CPU
    (the fastest counts; other processes on the machine can still inflate it)."""
    torch.manual_seed(0)
    model = SeqModel(run.config.model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    task = make_task(run.config.task)
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(4):
        batch = task.sample(run.config.train.batch_size, gen)
        tic = time.perf_counter()
        loss, _, _ = loss_and_correct(model, batch, family=type(task))
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - tic)
    return min(times[1:])


def estimate_seconds(runs: list[PlannedRun]) -> dict[str, float]:
    """Each run's training time on this machine's CPU, estimated now: :func:`seconds_per_step`, measured once per
    (core, positional encoding), times the run's iterations (`gradscope reproduce --dry-run`'s last column)."""
    per_step: dict[tuple[str, str], float] = {}
    estimates = {}
    for r in runs:
        key = (r.config.model.core, r.config.model.pe)
        if key not in per_step:
            per_step[key] = seconds_per_step(r)
        estimates[r.name] = per_step[key] * r.config.train.iterations
    return estimates


def plan_study(options: StudyOptions, out: Path) -> Study:
    """The study's runs, checked before anything runs (memory of every run's training and stability;
    the extension's sizes), by the study's own plan (:data:`STUDY_PLANS`; a study on a corpus prepares it first: its
    vocabulary sizes the runs)."""
    runs, stability = STUDY_PLANS[options.study](options, out)
    for r in runs:  # before anything runs: every run's training and stability must fit in memory
        check_run_sizes(r, stability)
    if options.extend_to is not None:  # checked now, not after hours of training
        vocab = max(r.config.task.vocab_size for r in runs)
        check(options.extend_to > vocab, f"extend_to: got {options.extend_to}; it must exceed the study's "
                                         f"vocabulary ({vocab})")
        study_extension_plans(runs, options.extend_to, options.extend_iterations)
    return Study(options, runs, stability, Layout(out))


def run_study(study: Study, *, command: str = "", on_train: Callable[[PlannedRun, int], None] | None = None,
              on_step: Callable[[str, PlannedRun | None, str], None] | None = None,
              on_event: Callable[[str, str], None] | None = None) -> StudyResult:
    """Every run of the study, in order: train (or resume, or skip), its accuracy store and its stability
    store (each skipped when it exists); then the accuracy and stability summary stores over the runs
    (rewritten every time); then the extension experiment when asked. ``on_train(run, iteration)``
    reports training steps; ``on_step(step, run, what)`` each finished step ("train", "accuracy",
    "stability"; what it did); ``on_event`` the extension's messages."""
    layout, runs = study.layout, study.runs
    layout.root.mkdir(parents=True, exist_ok=True)
    for r in runs:
        done = train_step(r, layout, None if on_train is None else (lambda i, _log, r=r: on_train(r, i)), command)
        if on_step is not None:
            on_step("train", r, done)
        for name, make, path in (("accuracy", lambda: accuracy_step(r, layout, command), layout.accuracy(r)),
                                 ("stability", lambda: stability_step(r, layout, study.stability, command),
                                  layout.stability(r))):
            ds = make()
            if ds is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_store(ds, path)
            if on_step is not None:
                on_step(name, r, "done earlier" if ds is None else "written")
    summaries = {}
    for kind, summary_path in (("accuracy", layout.summary_accuracy), ("stability", layout.summary_stability)):
        paths = [layout.accuracy(r) if kind == "accuracy" else layout.stability(r) for r in runs]
        records = [rec for p in paths for rec in trial_records(p)]
        metrics = list(dict.fromkeys(m for rec in records for m in rec.metrics))
        entries = summarize_groups(group_records(records, SUMMARY_FIELDS), SUMMARY_FIELDS, metrics)
        write_store(summary_dataset(entries, SUMMARY_FIELDS, summary_attrs(command, SUMMARY_FIELDS, "trial", "percentile",
                                                                           0.95, 10_000, paths, kind)),
                    summary_path, overwrite=True)
        summaries[kind] = entries
    extension = None
    if study.options.extend_to is not None:
        extension = study_extension(layout, runs, study.options.extend_to, study.options.extend_iterations,
                                    on_event=on_event)
    return StudyResult(study, summaries, extension)


def reproduce(out: str | Path = "study", *, opts: StudyOptions | None = None, **overrides: Any) -> StudyResult:
    """The whole study from Python, as `gradscope reproduce` runs it (the report aside: ``gradscope report
    OUT/runs/* OUT/stores/*.zarr``, or the command). ``opts``: :class:`StudyOptions` (None: its defaults),
    ``overrides`` its fields, named as the flags. The plan alone (``--dry-run``): :func:`plan_study`, and
    :func:`estimate_seconds` for its training time."""
    return run_study(plan_study(with_overrides(StudyOptions, opts, overrides, "reproduce"), Path(out)))


Event = Callable[[str, str], None]  # (step, message)


def train_step(r: PlannedRun, layout: Layout, on_step: Callable[[int, dict | None], None] | None = None,
               command: str = "") -> str:
    """Train (or resume, or skip) one run; returns what was done."""
    run_dir = layout.run(r)
    resume = is_run_dir(run_dir)
    if resume:
        check(read_run_config(run_dir) == r.config, f"{run_dir}: this run was started with a different "
                                                    f"configuration than the plan; move it away or choose another out (--out)")
    if (run_dir / EVAL_FILE).exists():
        return "done earlier"
    if resume and not resumable(run_dir):  # killed before its first checkpoint
        discard_unstarted(run_dir)
        resume = False
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    train(r.config, run_dir, resume=resume, on_step=on_step, command=command)
    return "resumed" if resume else "trained"


def accuracy_step(r: PlannedRun, layout: Layout, command: str = "", opts: AccuracyOptions = AccuracyOptions(),
                  checkpoints: str | tuple[int, ...] = CHECKPOINTS[1]) -> "xr.Dataset | None":
    """The accuracy store of one run (at the chosen checkpoints), or None when it exists already."""
    if layout.accuracy(r).exists():
        return None
    return run_checkpoint_accuracy(select_checkpoints(layout.run(r), checkpoints), opts, command=command,
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
                   checkpoints: str | tuple[int, ...] = CHECKPOINTS[1]) -> "xr.Dataset | None":
    """The stability store of one run (``opts``' conditions at the chosen checkpoints), or None
    when it exists."""
    if layout.stability(r).exists():
        return None
    return run_checkpoint_stability(select_checkpoints(layout.run(r), checkpoints), opts, command=command,
                         device_label=opts.device).to_xarray()
