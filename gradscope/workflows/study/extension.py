"""The vocabulary-extension experiment (paper §4.2, Fig. 5) as a study step: for each PE kind and
seed, pretrain at K, extend to K' (only the new rows train), and train from scratch at K'; then
compare the held-out token accuracy of extension and scratch, overall and on old and new items.

Resumable like `gradscope reproduce`: a run with ``eval.json`` is done; a started one is resumed
from its last checkpoint; the table is recomputed from the runs' final checkpoints.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from gradscope.analysis.accuracy import token_accuracy
from gradscope.analysis.bootstrap import Interval, bootstrap_mean
from gradscope.config import RunConfig
from gradscope.errors import check
from gradscope.guard import safe_component
from gradscope.files.checkpoint import load
from gradscope.train.evaluate import item_accuracy, predict
from gradscope.train.extend import extension_config
from gradscope.files.io import atomic_write_text
from gradscope.train.loop import EVAL_FILE, discard_unstarted, is_run_dir, read_run_config, resumable, train

from gradscope.workflows.study.runs import Layout, PlannedRun

KINDS = ("pretrain", "extension", "scratch")
PES = ("none", "sinusoidal")


@dataclass(frozen=True)
class ExtensionPlan:
    """The experiment: ``base`` (the model, task and training at K = its vocabulary), extended to
    ``extended_vocab`` items with ``extend_iterations`` iterations of training on the new rows;
    scratch runs train ``base`` at K' for as many iterations as the pretraining had."""

    base: RunConfig
    extended_vocab: int
    seeds: tuple[int, ...] = (1, 2, 3)
    pes: tuple[str, ...] = PES
    extend_iterations: int | None = None  # None: as many as the pretraining
    new_item_share: float | None = None
    distribution: str | None = None  # the K' data's (extension and scratch); None: the pretraining's

    def __post_init__(self) -> None:
        check(self.extended_vocab > self.base.task.vocab_size,
              f"extended_vocab: got {self.extended_vocab}; it must exceed the pretraining vocabulary "
              f"{self.base.task.vocab_size}")
        check(bool(self.seeds) and len(set(self.seeds)) == len(self.seeds), f"seeds: got {self.seeds}; distinct seeds")
        check(self.extend_iterations is None or self.extend_iterations >= 1,
              f"extend_iterations: got {self.extend_iterations}; it must be positive")

    def name(self, kind: str, pe: str, seed: int) -> str:
        K, K2, core = self.base.task.vocab_size, self.extended_vocab, self.base.model.core
        vocab = {"pretrain": f"K{K}", "extension": f"K{K}to{K2}", "scratch": f"K{K2}"}[kind]
        return safe_component(f"{core}-{pe}-{vocab}-s{seed}", "run name")

    def config(self, kind: str, pe: str, seed: int) -> RunConfig:
        """The pretraining or scratch run's config (extension runs are configured from their parent)."""
        b = self.base
        vocab = b.task.vocab_size if kind == "pretrain" else self.extended_vocab
        dist = b.task.distribution if kind == "pretrain" or self.distribution is None else self.distribution
        return RunConfig(model=dataclasses.replace(b.model, pe=pe, vocab_size=vocab),
                         task=dataclasses.replace(b.task, vocab_size=vocab, distribution=dist),
                         train=dataclasses.replace(b.train, seed=seed))


def _train(cfg: RunConfig, run_dir: Path, extend_from: Path | None = None) -> str:
    if (run_dir / EVAL_FILE).exists():
        check(read_run_config(run_dir) == cfg, f"{run_dir}: a finished run of another configuration; move it away")
        return "done earlier"
    resume = is_run_dir(run_dir)
    if resume:
        check(read_run_config(run_dir) == cfg, f"{run_dir}: started with another configuration; move it away")
        if not resumable(run_dir):
            discard_unstarted(run_dir)
            resume = False
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    train(cfg, run_dir, resume=resume, extend_from=None if resume else extend_from)
    return "resumed" if resume else "trained"


def run_extension(plan: ExtensionPlan, root: Path, on_event: Callable[[str, str], None] | None = None,
                  parents: dict[tuple[str, int], Path] | None = None) -> Path:
    """Train every run of ``plan`` under ``root``/runs (pretrain, then extension and scratch, per PE
    and seed); returns the runs' directory. ``parents``: (pe, seed) → a run directory trained
    elsewhere with the pretraining config (e.g. a `gradscope reproduce` study's), used instead."""
    runs = Path(root) / "runs"
    for pe in plan.pes:
        for seed in plan.seeds:
            parent = (parents or {}).get((pe, seed), runs / plan.name("pretrain", pe, seed))
            done = _train(plan.config("pretrain", pe, seed), parent)
            if on_event:
                on_event("pretrain", f"{parent.name}: {done}")
            train_opts = {"seed": seed}
            if plan.extend_iterations is not None:
                t = plan.base.train
                every = max(1, min(t.checkpoint_every, plan.extend_iterations))
                train_opts.update(iterations=plan.extend_iterations, checkpoint_every=every,
                                  warmup=min(t.warmup, plan.extend_iterations // 10),
                                  log_every=max(1, min(t.log_every, every)))
            task_opts = {} if plan.distribution is None else {"distribution": plan.distribution}
            ext_cfg = extension_config(parent, plan.extended_vocab, new_item_share=plan.new_item_share,
                                       train=train_opts, task=task_opts)
            ext = runs / plan.name("extension", pe, seed)
            done = _train(ext_cfg, ext, extend_from=parent)
            if on_event:
                on_event("extension", f"{ext.name}: {done}")
            scratch = runs / plan.name("scratch", pe, seed)
            done = _train(plan.config("scratch", pe, seed), scratch)
            if on_event:
                on_event("scratch", f"{scratch.name}: {done}")
    return runs


@dataclass(frozen=True)
class ExtensionRow:
    """One (kind, PE) cell of the table: per-seed accuracies and their bootstrap means/CIs."""

    kind: str
    pe: str
    seeds: tuple[int, ...]
    overall: tuple[float, ...]
    old: tuple[float, ...]
    new: tuple[float, ...]

    def interval(self, which: str, seed: int = 0) -> Interval:
        return bootstrap_mean(np.asarray(getattr(self, which), dtype=np.float64), seed=seed)


def final_accuracy(run_dir: Path, old_items: int) -> tuple[float, float, float]:
    """Held-out token accuracy of a run's last checkpoint: overall, on items < ``old_items`` and on
    the others (the uniform held-out set of that run; self-fed for a feedback model)."""
    loaded = load(run_dir)
    held = loaded.heldout.uniform
    preds = predict(loaded.model, held.inputs)
    items = item_accuracy(preds, held.targets, old_items)
    return float(token_accuracy(preds, held.targets)), items["old"], items["new"]


def extension_table(plan: ExtensionPlan, root: Path, parents: dict[tuple[str, int], Path] | None = None
                    ) -> list[ExtensionRow]:
    """The accuracy table of a finished :func:`run_extension`: (extension, scratch, pretrain) × PE."""
    runs = Path(root) / "runs"
    rows = []
    K = plan.base.task.vocab_size
    for kind in ("extension", "scratch", "pretrain"):
        for pe in plan.pes:
            dirs = [(parents or {}).get((pe, s), runs / plan.name(kind, pe, s)) if kind == "pretrain"
                    else runs / plan.name(kind, pe, s) for s in plan.seeds]
            values = [final_accuracy(d, K) for d in dirs]
            rows.append(ExtensionRow(kind, pe, tuple(plan.seeds), *(tuple(v[i] for v in values) for i in range(3))))
    return rows


def table_markdown(rows: list[ExtensionRow], plan: ExtensionPlan) -> str:
    """The table as Markdown: mean [95% bootstrap CI over seeds] of held-out token accuracy, overall
    and on old (< K) and new items."""
    K, K2 = plan.base.task.vocab_size, plan.extended_vocab
    lines = [f"| run | PE | token accuracy | old items (< {K}) | new items (≥ {K}) |", "|---|---|---|---|---|"]
    labels = {"extension": f"extended {K}→{K2}", "scratch": f"scratch at {K2}", "pretrain": f"pretrained at {K}"}
    for r in rows:
        cells = []
        for which in ("overall", "old", "new"):
            i = r.interval(which)
            cells.append("—" if i.n == 0 else f"{i.mean:.3f} [{i.low:.3f}, {i.high:.3f}]")
        lines.append(f"| {labels[r.kind]} | {r.pe} | " + " | ".join(cells) + " |")
    seeds = ", ".join(map(str, plan.seeds))
    lines.append(f"\nMeans over seeds {seeds} with 95% percentile-bootstrap intervals (10,000 resamples, trial "
                 f"unit; with {len(plan.seeds)} trials these under-cover).")
    return "\n".join(lines) + "\n"


def study_extension_plans(runs: list[PlannedRun], extended_vocab: int, iterations: int | None = None
                          ) -> list[tuple[str, ExtensionPlan, list[PlannedRun]]]:
    """Per core of the study: (core, its extension plan, its runs). Building the plans checks the
    extension's settings, so `reproduce` calls this before it trains anything."""
    plans = []
    for core in dict.fromkeys(r.config.model.core for r in runs):
        mine = [r for r in runs if r.config.model.core == core]
        base = mine[0].config
        base = RunConfig(model=dataclasses.replace(base.model, pe="none"), task=base.task, train=base.train)
        seeds = tuple(dict.fromkeys(r.config.train.seed for r in mine))
        pes = tuple(dict.fromkeys(r.config.model.pe for r in mine))
        plans.append((core, ExtensionPlan(base, extended_vocab, seeds=seeds, pes=pes, extend_iterations=iterations,
                                          distribution="uniform"), mine))
    return plans


def study_extension(layout: Layout, runs: list[PlannedRun], extended_vocab: int, iterations: int | None = None,
                    on_event: Callable[[str, str], None] | None = None) -> str:
    """The extension step of `gradscope reproduce`: per core of the study, its vanilla and PE runs
    (vocabulary K) are the pretrained parents; each is extended to ``extended_vocab`` items and a
    model is trained from scratch at that size, both on uniform data. Writes (atomically) and
    returns ``<study>/extension/table.md``."""
    root = layout.root / "extension"
    parts = []
    for core, plan, mine in study_extension_plans(runs, extended_vocab, iterations):
        parents = {(r.config.model.pe, r.config.train.seed): layout.run(r) for r in mine}
        run_extension(plan, root / core, on_event, parents)
        parts.append(f"### {core}\n\n" + table_markdown(extension_table(plan, root / core, parents), plan))
    text = "\n".join(parts)
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(root / "table.md", text)
    return text
