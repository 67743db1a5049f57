"""`gradscope stability`: checkpoints + probe options → per-checkpoint stability results."""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import xarray as xr
from torch import nn

from gradscope.fields import DEFAULT_SCORE, RESAMPLES
from gradscope.workflows.options import DEVICE_LABEL
from gradscope.analysis.bootstrap import Interval, bootstrap_mean
from gradscope.analysis.cost import OVERRUN, PlanWarning, Rates
from gradscope.analysis.stability import PAIRS, StabilityPlan, StabilityResult, plan_stability, probe_stability
from gradscope.rates import current_rates
from gradscope.config import ModelConfig
from gradscope.models.wrap import fit_positions
from gradscope.errors import GradscopeError, check
from gradscope.guard import check_bytes
from gradscope.store.parts import record_checkpoint_configs
from gradscope.store.records import CheckpointResult
from gradscope.store.stability import probe_table_source, probes_from_store, stability_dataset
from gradscope.tasks.probes import (Probes, check_probes_fit, frequency_groups, make_probes, read_counts_file,
                                    read_probe_arrays, validate_probes)
from gradscope.files.checkpoint import Loaded
from gradscope.train.device import resolve_device
from gradscope.tasks.registry import TASKS, probe_tasks
from gradscope.workflows.families.registry import check_probe_options, evaluation_of
from gradscope.workflows.common import (conditions_for, config_attrs, expand_checkpoints, load_source, model_id,
                                        warn_diverged)
from gradscope.tasks import make_task
from gradscope.tasks.config import TaskConfig
from gradscope.workflows.options import StabilityOptions  # declared there, torch-free (--help)




def read_probes_file(path: Path, length: int | None = None) -> Probes:
    """Probe triplets from .npy (int (n, 3, L)), .npz (``tokens`` plus optional ``target_group`` and
    ``disturbant_group`` string arrays) or a previous stability store (.zarr), checked (see
    :func:`~gradscope.tasks.probes.read_probe_arrays`; ids against the vocabulary once the model is known)."""
    path = Path(path)
    if path.is_dir():
        return validate_probes(probes_from_store(path), f"probes: {path}")
    return read_probe_arrays(path, length)


def result_bytes(triplets: int, length: int, checkpoints: int, top_sv: int) -> int:
    """Memory that ``triplets`` probes of length L and their results over ``checkpoints`` take:
    the token ids with their output phase (3 · 2L int64 per triplet, twice while batching) and,
    held for every checkpoint until the store is written (then copied once), the float64 scores,
    statistics and ``top_sv`` singular values."""
    values = 24  # per pair: the scores, the companion statistics and the Wirtinger parts (17), generously
    return triplets * (2 * 3 * 2 * length * 8 + 2 * checkpoints * (2 * values + 3 * top_sv) * 8)


def probe_vocab(task: TaskConfig) -> int:
    """How many probe token ids a task's models read, as its family declares (K; a vector task: the
    size of the table of sphere points the ids index)."""
    return make_task(task).probe_ids


def check_store_table(path: Path, first: Loaded, seed: int) -> None:
    """Probes from the stability store ``path`` on ``first``: a vector model's probe ids index the
    table of sphere points of a seed, so they must come from a vector model's store of the same
    seed (another seed's table would score other vectors); a token model's from a token model's."""
    inputs, stored = probe_table_source(path)
    vectors = first.config.model.inputs == "vectors"
    if inputs is not None:
        check((inputs == "vectors") == vectors,
              f"probes: {path} holds probes of a {inputs} model; {first.path} reads "
              f"{'vectors' if vectors else 'tokens'}, whose probe ids mean other inputs")
    if vectors:
        check(stored is not None, f"probes: {path} does not record the seed of its sphere-point table; "
                                  f"a vector model's probe ids cannot be read without it")
        check(stored == seed, f"seed: got {seed}; the probes of {path} index the sphere points of seed {stored} "
                              f"(give seed {stored}, or leave probes out for new probes)")


def build_probes(first: Loaded, opts: StabilityOptions, checkpoints: int = 1) -> Probes:
    """The probes for ``first``'s task: read from ``opts.probes`` or generated, checked against
    its vocabulary and length, and (with their results over ``checkpoints``) against memory."""
    task = first.config.task
    source = evaluation_of(TASKS[task.name]).text_probes
    if source is not None:  # the family's own text: triplets of real text from its corpus's test split
        check(opts.probes is None, f"probes: {task.name} checkpoints draw their probes from their corpus")
        check(set(opts.disturbant) <= {source.label},
              f"disturbant: got {', '.join(opts.disturbant)}; on {task.name} checkpoints the disturbants are "
              f"the corpus's own text ({source.label})")
        own = source.task(first, opts)
        length = opts.length or task.length
        groups = opts.target_freq or source.groups
        check_bytes(result_bytes(len(groups) * opts.triplets, length, checkpoints, 64), "triplets")
        return source.probes(own, opts.triplets, opts.target_pos, length, groups, opts.seed)
    check_probe_options(first, opts)  # another family's own probe options: refused
    check(task.name in probe_tasks(),
          f"checkpoint: its task is {task.name!r}; stability probes are defined for "
          f"{', '.join(probe_tasks())} (an input phase followed by query tokens)")
    length = task.length
    check(1 <= opts.target_pos <= length, f"target_pos: got {opts.target_pos}; valid positions are 1…{length}")
    kept = min(opts.sv, first.model.core.out_dim, first.model.core.state_dim)
    if opts.probes is not None:
        probes = read_probes_file(opts.probes, length)
        if opts.probes.is_dir():
            check_store_table(opts.probes, first, opts.seed)
    else:
        conditions = conditions_for(task, opts.target_freq, opts.disturbant)
        check_bytes(result_bytes(len(conditions) * opts.triplets, length, checkpoints, kept), "triplets")
        probes = make_probes(opts.triplets, length, opts.target_pos, probe_vocab(task), conditions, opts.seed)
    check_probes_fit(probes, probe_vocab(task), length)
    check_bytes(result_bytes(len(probes), length, checkpoints, kept), "probes")
    return probes


@dataclass(frozen=True)
class StabilityRun:
    """A finished stability analysis: every checkpoint's results on the same probes.
    :meth:`to_xarray` gives the stability store's dataset; :meth:`summary` the table's rows.
    ``configs``: each checkpoint's own config dicts (checkpoints of different models may be
    analysed together; each is labelled by its own)."""

    config: dict[str, Any]  # model_config, task_config, train_config (of the first checkpoint)
    probes: Probes
    results: list[CheckpointResult]
    options: StabilityOptions
    command: str = ""
    device: str = DEVICE_LABEL
    configs: tuple[dict[str, Any], ...] = ()
    plans: tuple[StabilityPlan, ...] = ()  # per checkpoint: exact or sketch, and why

    def to_xarray(self) -> xr.Dataset:
        options = {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self.options).items()}
        ds = stability_dataset(self.results, self.probes, options, self.config, self.command, self.device)
        ds = record_checkpoint_configs(ds, self.configs)
        ds = ds.assign_coords(model=("checkpoint", np.asarray(self.models, dtype=object)))
        ds.attrs["nan_scores"] = json.dumps(self.nan_count)
        ds.attrs["nonfinite_jacobians"] = self.nonfinite_jacobians
        if self.plans:
            ds.attrs["stability_plan"] = json.dumps([dataclasses.asdict(p) for p in self.plans])
        return ds

    @property
    def models(self) -> list[str]:
        """Each checkpoint's model label, ``<core>-<pe>`` from its own config (its class name for a
        model of your own)."""
        configs = self.configs or (self.config,) * len(self.results)
        return [model_id(c["model_config"]) for c in configs]

    def summary(self, kind: str = DEFAULT_SCORE, seed: int = 0, resamples: int = RESAMPLES) -> list["SummaryRow"]:
        return summarize(self.results, self.probes, kind, seed, resamples, self.models)

    @property
    def nan_count(self) -> dict[str, int]:
        """NaN scores (all-zero or non-finite Jacobians) per score kind, over every checkpoint and pair."""
        return {k: sum(int(r.result.scores[k].isnan().sum()) for r in self.results) for k in self.results[0].result.scores}

    @property
    def nonfinite_jacobians(self) -> int:
        """Jacobians with a NaN or Inf entry (a diverged model), over every checkpoint and member."""
        return sum(r.result.nonfinite_count for r in self.results)


def plan_model(model: nn.Module, opts: StabilityOptions, probes: Probes, position: int,
               output_phase: int | None | str, rates: Rates | None = None) -> StabilityPlan:
    """:func:`~gradscope.analysis.stability.plan_stability` for ``model`` on ``probes``: the one estimate
    every path (checkpoints, factories, ``--model hf``, in-memory models) decides exact or sketch by, at
    ``rates`` (None: this machine's now, :func:`gradscope.rates.current_rates`)."""
    steps = probes.length * (1 if output_phase is None else 2)
    param = next(model.parameters())
    return plan_stability(model.core, 3 * len(probes), steps, position, estimator=opts.estimator,
                          units=opts.sketch_units, checkpoint_budget_seconds=opts.checkpoint_budget_seconds,
                          element_size=param.element_size(), rates=current_rates() if rates is None else rates)


class _Replan(Exception):
    """Raised out of the first chunk's progress call: the plan changes (see :func:`watched_stability`)."""

    def __init__(self, plan: StabilityPlan, rates: Rates) -> None:
        super().__init__(plan.note)
        self.plan, self.rates = plan, rates


def watched_stability(model: nn.Module, probes: Probes, position: int, opts: StabilityOptions,
                      output_phase: int | None | str, rates: Rates,
                      on_progress: Callable[[int], None] | None = None,
                      on_plan: Callable[[StabilityPlan], None] | None = None
                      ) -> tuple[StabilityResult, StabilityPlan, Rates]:
    """:func:`~gradscope.analysis.stability.probe_stability` under the budget rule's run-time half:
    the plan is made at ``rates``, and the first chunk of triplets measures it. When the rest at the
    measured pace would end past :data:`~gradscope.workflows.dynamics.OVERRUN` × the budget and the plan was
    the tool's choice (``estimator`` auto, or sketch without ``sketch_units``), the work is planned again at
    the measured rates (exact → sketch, or fewer units), said with a :class:`PlanWarning` and ``on_plan``,
    and started again; the first chunk's work is dropped. A plan the user fixed runs on, with a warning.
    Returns the result, the plan it ran and the rates to plan the next checkpoint with."""
    plan = plan_model(model, opts, probes, position, output_phase, rates)
    if on_plan is not None:
        on_plan(plan)
    budget = opts.checkpoint_budget_seconds
    chosen = opts.estimator != "exact" and opts.sketch_units is None
    for attempt in range(2):
        start = time.perf_counter()
        first = [attempt == 0]

        def on_chunk(n: int, plan: StabilityPlan = plan) -> None:
            if first[0]:
                first[0] = False
                took, share = time.perf_counter() - start, n / len(probes)
                ratio = took / max(plan.seconds * share, 1e-9)
                projected = took + ratio * plan.seconds * (1 - share)
                if share < 1 and projected > OVERRUN * budget:
                    if chosen:
                        faster = rates.scaled(ratio)
                        try:
                            again = plan_model(model, opts, probes, position, output_phase, faster)
                        except GradscopeError:
                            again = plan
                        if (again.estimator, again.units) != (plan.estimator, plan.units):
                            warnings.warn(f"stability: planned again after the first {n} triplets, which took "
                                          f"{ratio:.2g}× their estimate here (~{projected:,.0f} s for the "
                                          f"checkpoint, budget {budget:g} s); their work is dropped", PlanWarning,
                                          stacklevel=2)
                            raise _Replan(again, faster)
                    warnings.warn(f"stability: the first {n} triplets took {ratio:.2g}× their estimate here; this "
                                  f"checkpoint will take ~{projected:,.0f} s, past its {budget:g} s budget"
                                  + ("" if chosen else " (the plan is fixed by --estimator/--sketch-units)"),
                                  PlanWarning, stacklevel=2)
            if on_progress is not None:
                on_progress(n)

        try:
            result = probe_stability(model, probes, position, method=opts.method, chunk=opts.batch_size,
                                     top_sv=opts.sv, on_chunk=on_chunk, output_phase=output_phase, plan=plan,
                                     seed=opts.seed)
            return result, plan, rates
        except _Replan as again:
            plan, rates = again.plan, again.rates
            if on_plan is not None:
                on_plan(plan)
    raise AssertionError("unreachable: the second attempt never re-plans")


def warn_diverged_jacobians(run: StabilityRun) -> None:
    """:func:`~gradscope.workflows.common.warn_diverged` when some Jacobians were non-finite."""
    bad = run.nonfinite_jacobians
    if bad:
        total = sum(r.result.singular_values.shape[0] * r.result.singular_values.shape[1] for r in run.results)
        warn_diverged(f"{bad} of {total} Jacobians", f"their scores are NaN ({run.nan_count['default']} default "
                                                      f"scores), counted and left out of every mean")


def run_checkpoint_stability(paths: list[Path | Loaded], opts: StabilityOptions, *,
                             on_start: Callable[[int], None] | None = None,
                             on_progress: Callable[[int], None] | None = None, command: str = "",
                             device_label: str | None = None, probes: Probes | None = None,
                             on_plan: Callable[[StabilityPlan], None] | None = None) -> StabilityRun:
    """Analyse every checkpoint with the same probes. ``on_start(total triplets)`` then
    ``on_progress(k)`` report progress. Checkpoints are loaded one at a time, and each is dropped
    (optimizer state and all) before the next is loaded. Non-finite Jacobians (a diverged model)
    give NaN scores and a :class:`DivergedWarning`."""
    files = expand_checkpoints(paths)
    device = resolve_device(opts.device)
    loaded = load_source(files[0])
    first = loaded.path
    task = loaded.config.task
    text = evaluation_of(TASKS[task.name]).text_probes is not None  # rows start with the start token; no output phase
    if probes is None:
        probes = build_probes(loaded, opts, len(files))
    else:
        probes = validate_probes(probes)
        check_probes_fit(probes, probe_vocab(task) + text, probes.length if text else task.length)
    position, output_phase = (opts.target_pos + 1, None) if text else (opts.target_pos, "query")
    config = config_attrs(loaded.config)
    if on_start is not None:
        on_start(len(files) * len(probes))
    results, configs, plans = [], [], []
    rates: Rates | None = None  # this machine's, as the first checkpoint measured them
    for i, item in enumerate(files):
        if i:
            loaded = load_source(item)
        path = loaded.path
        check(loaded.config.task.vocab_size == task.vocab_size and loaded.config.task.length == task.length,
              f"checkpoint: {path} has a different vocabulary or length than {first}; analyse it separately")
        model = loaded.model.to(device)
        model = make_task(loaded.config.task).probed(model, opts.seed)  # as the family's probes see it
        rates = current_rates() if rates is None else rates
        result, plan, rates = watched_stability(model, probes, position, opts, output_phase, rates, on_progress,
                                                on_plan)
        plans.append(plan)
        run = path.parent.name if path.parent != Path("") else ""
        results.append(CheckpointResult(path, loaded.iteration, run, result))
        configs.append(config_attrs(loaded.config))
        loaded = model = None  # only one checkpoint in memory at a time
    out = StabilityRun(config, probes, results, opts, command,
                       device_label if device_label is not None else str(device), tuple(configs), tuple(plans))
    warn_diverged_jacobians(out)
    return out


def model_probes(model: nn.Module, opts: StabilityOptions) -> Probes:
    """Probes for a user's own model: from ``probes_file`` (token ids, (n, 3, T)), or generated
    from ``token_counts`` (counts per token id; groups by :func:`frequency_groups`) and ``length``."""
    vocab = getattr(getattr(model, "inputs", None), "num_embeddings", None)
    kept = min(opts.sv, model.core.out_dim, model.core.state_dim)
    if opts.probes is not None:
        probes = read_probes_file(opts.probes)
    else:
        check(opts.token_counts is not None and opts.length is not None,
              "probes: a model of your own needs probes: a file of token ids, or token_counts and length "
              "to generate them")
        counts = read_counts_file(opts.token_counts)
        check(vocab is None or counts.numel() <= vocab,
              f"token_counts: {opts.token_counts} has {counts.numel()} entries; the model's embedding has {vocab} rows")
        pools = frequency_groups(counts, opts.split)
        groups = ("frequent", "rare")
        for name, chosen in (("target_freq", opts.target_freq), ("disturbant", opts.disturbant)):
            bad = [g for g in chosen if g not in pools]
            check(not bad, f"{name}: got {bad[0] if bad else ''!r}; valid values are {', '.join(pools)}")
        conditions = list(itertools.product(opts.target_freq or groups, opts.disturbant or groups))
        check(opts.target_pos <= opts.length, f"target_pos: got {opts.target_pos}; valid positions are 1…{opts.length}")
        check_bytes(result_bytes(len(conditions) * opts.triplets, opts.length, 1, kept), "triplets")
        probes = make_probes(opts.triplets, opts.length, opts.target_pos, counts.numel(), conditions, opts.seed,
                             pools=pools)
    check_bytes(result_bytes(len(probes), probes.length, 1, kept), "probes")
    if vocab is not None:
        check_probes_fit(probes, int(vocab), probes.length)
    return probes


def run_model_stability(model: nn.Module, opts: StabilityOptions, *, probes: Probes | None = None,
                        source: Path | None = None, iteration: int = -1, command: str = "",
                        config: dict[str, Any] | None = None,
                        on_start: Callable[[int], None] | None = None,
                        on_progress: Callable[[int], None] | None = None,
                        on_plan: Callable[[StabilityPlan], None] | None = None,
                        position: int | None = None) -> StabilityRun:
    """Stability of one in-memory model (a user's wrapped model, or a loaded gradscope model).
    The output phase holds ``opts.filler`` (None: no output phase) for a wrapped model, the query
    token for a gradscope model. Non-finite Jacobians give NaN scores and a :class:`DivergedWarning`.
    ``position``: the probe row's column (1-based) of the target when it is not ``opts.target_pos``
    (text probe rows start with the tokenizer's start token)."""
    check(isinstance(model, nn.Module) and hasattr(model, "core") and hasattr(model, "core_inputs"),
          f"model: expected a gradscope model or gradscope.wrap(...); got {type(model).__name__}")
    device = resolve_device(opts.device)
    vocab = getattr(getattr(model, "inputs", None), "num_embeddings", None)
    if probes is None:
        probes = model_probes(model, opts)
    else:
        probes = validate_probes(probes)
        if vocab is not None:
            check_probes_fit(probes, int(vocab), probes.length)
    check(1 <= opts.target_pos <= probes.length, f"target_pos: got {opts.target_pos}; valid positions are 1…{probes.length}")
    position = opts.target_pos if position is None else position
    check(opts.filler is None or vocab is None or opts.filler < vocab,
          f"filler: got {opts.filler}; the model's vocabulary is 0…{vocab - 1 if vocab else 0}")
    if on_start is not None:
        on_start(len(probes))
    own_query = getattr(model, "query_token", None)
    output_phase = own_query if own_query is not None and opts.filler is None else opts.filler
    model = fit_positions(model, probes.length * (1 if output_phase is None else 2)).to(device)
    result, plan, _ = watched_stability(model, probes, position, opts, output_phase, current_rates(), on_progress,
                                        on_plan)
    path = Path(source) if source is not None else Path("<in memory>")
    if config is None:
        own = getattr(model, "config", None)
        described = dataclasses.asdict(own) if isinstance(own, ModelConfig) else \
            model.describe() if hasattr(model, "describe") else {"core": type(model.core).__name__}
        config = {"model_config": described, "task_config": {}, "train_config": {}}
    run = path.parent.name if source is not None else ""
    out = StabilityRun(config, probes, [CheckpointResult(path, iteration, run, result)], opts, command, str(device),
                       (config,), (plan,))
    warn_diverged_jacobians(out)
    return out


@dataclass(frozen=True)
class SummaryRow:
    iteration: int
    run: str
    condition: str
    pair: str
    interval: Interval
    checkpoint: int = 0  # index among the analysed checkpoints (rows of one checkpoint share it)
    model: str = ""  # the checkpoint's model label (see StabilityRun.models)


def summarize(results: list[CheckpointResult], probes: Probes, kind: str = DEFAULT_SCORE, seed: int = 0,
              resamples: int = RESAMPLES, models: list[str] | None = None) -> list[SummaryRow]:
    """Mean score with a 95% bootstrap CI over triplets, per checkpoint × condition × pair; NaN
    scores are counted in each interval's ``nan`` and left out of its mean."""
    check(kind in results[0].result.scores, f"score: got {kind!r}; valid values are "
                                            f"{', '.join(results[0].result.scores)}")
    conditions = probes.conditions
    order = list(dict.fromkeys(conditions))
    rows = []
    for c, r in enumerate(results):
        scores = r.result.scores[kind].numpy()  # (2, n)
        for cond in order:
            mask = np.array([x == cond for x in conditions])
            for i, pair in enumerate(PAIRS):
                rows.append(SummaryRow(r.iteration, r.run, cond, pair,
                                       bootstrap_mean(scores[i, mask], seed=seed, resamples=resamples), c,
                                       models[c] if models else ""))
    return rows
