"""`gradscope summarize`: combine runs (trials = seeds) into means with confidence intervals.

Works on plain records (see :class:`TrialRecord`), so it is independent of the store format.
Trial unit (default, as in the paper): one value per seed, bootstrapped across seeds. Token unit:
the underlying units (tokens, sequences or probe triplets) of all seeds pooled and resampled —
narrower intervals that ignore between-seed variation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from gradscope.fields import CONFIDENCE, EQUIVALENCE_MARGIN, INTERVAL, RESAMPLES
from gradscope.workflows.options import UNITS
from gradscope.analysis.bootstrap import (FEW_TRIALS, PermutationResult, confidence_interval,
                                          paired_permutation_test)
from gradscope.analysis.trend import trend_test
from gradscope.errors import GradscopeError, check
from gradscope.models.registry import core_options
from gradscope.store.records import SummaryEntry, TrainingComparison, TrainingPoint, TrialRecord
from gradscope.store.io import store_kind
from gradscope.store.summary import (expand_store_paths, summary_attrs, summary_dataset, training_dataset,
                                     trial_records)
from gradscope.fields import with_overrides
from gradscope.workflows.options import SummarizeOptions

# `--by` names of the shared fields; the registered cores' own settings add theirs (field_aliases)
FIELD_ALIASES = {"model": "core", "core": "core", "pe": "pe", "combine": "pe_combine", "vocab": "vocab_size",
                 "hidden": "hidden_size", "embed": "embed_size", "layers": "num_layers", "task": "task",
                 "length": "length", "distribution": "distribution", "rarity": "rarity"}


def field_aliases() -> dict[str, str]:
    """`--by` name → summary field: each field by its own name (as `gradscope train` names the setting,
    e.g. vocab_size or vocab-size), its short alias (:data:`FIELD_ALIASES`, vocab), and each core
    setting's alias or name."""
    own = {o.alias or o.name: o.name for o in core_options().values()}
    fields = {f: f for f in (*FIELD_ALIASES.values(), *own.values())}
    return {**fields, **{f.replace("_", "-"): f for f in fields if "_" in f}, **FIELD_ALIASES, **own}


@dataclass(frozen=True)
class Comparison:
    label: str
    metric: str
    a: str
    b: str
    result: PermutationResult


def parse_by(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    aliases = field_aliases()
    for name in names:
        check(name in aliases, f"by: got {name!r}; valid fields are {', '.join(aliases)}")
    return tuple(aliases[n] for n in names)


def group_records(records: list[TrialRecord], by: tuple[str, ...]) -> dict[tuple[str, ...], list[TrialRecord]]:
    """Group trials by config fields, refusing mixtures that would make a group meaningless."""
    check(bool(records), "stores: nothing to summarize")
    kinds = {r.kind for r in records}
    check(len(kinds) == 1, f"stores: got a mix of {' and '.join(sorted(kinds))} stores; summarize each kind separately")
    tasks = {r.fields["task"] for r in records}
    check(len(tasks) == 1 or "task" in by,
          f"stores: they come from different tasks ({', '.join(sorted(tasks))}); add task to by (--by)")
    groups: dict[tuple[str, ...], list[TrialRecord]] = {}
    for r in records:
        lacking = [f for f in by if f not in r.fields]
        if lacking:
            raise GradscopeError(f"by: {r.path} has no {lacking[0]} in its configuration to group by; group by "
                                 f"other fields")
        groups.setdefault(tuple(r.fields[f] for f in by), []).append(r)
    for key, members in groups.items():
        seeds = [m.seed for m in members]
        dup = sorted({s for s in seeds if seeds.count(s) > 1})
        if dup:
            raise GradscopeError(f"stores: group {label_of(by, key)} has several stores for seed {dup[0]} "
                                 f"({', '.join(str(m.path) for m in members if m.seed == dup[0])}); "
                                 f"one store per seed")
    return dict(sorted(groups.items()))


def label_of(by: tuple[str, ...], key: tuple[str, ...]) -> str:
    return " ".join(f"{f}={v}" for f, v in zip(by, key)) or "all"


def unmatched_fields(records: list[TrialRecord], by: tuple[str, ...]) -> list[str]:
    """Config fields that differ between stores but are not grouped on (worth a warning)."""
    names = sorted({k for r in records for k in r.fields} - set(by))
    return [n for n in names if len({r.fields.get(n) for r in records}) > 1]


def summarize_groups(groups: dict[tuple[str, ...], list[TrialRecord]], by: tuple[str, ...], metrics: list[str], *,
                     unit: str = UNITS[0], method: str = INTERVAL, confidence: float = CONFIDENCE,
                     resamples: int = RESAMPLES, seed: int = 0) -> list[SummaryEntry]:
    """Mean and CI of every metric in every group."""
    check(unit in ("trial", "token"), f"unit: got {unit!r}; valid values are trial, token")
    if unit == "token":  # pooled resampling needs unit-level values (per-bin grid metrics have none)
        metrics = [m for m in metrics if all(m in r.units for rs in groups.values() for r in rs)]
    entries = []
    for key, members in groups.items():
        members = sorted(members, key=lambda m: m.seed)
        for metric in metrics:
            values = np.array([m.metrics.get(metric, np.nan) for m in members])
            if unit == "trial":
                sample = values
            else:
                sample = np.concatenate([m.units[metric] for m in members])
            interval = confidence_interval(sample, method=method, confidence=confidence, resamples=resamples,
                                           seed=seed)
            nan_units = sum(m.nan_units.get(metric, 0) for m in members)
            entries.append(SummaryEntry(key, label_of(by, key), metric, interval,
                                        tuple(m.seed for m in members), tuple(float(v) for v in values), nan_units))
    return entries


def _arms(groups: dict[tuple[str, ...], list[TrialRecord]], by: tuple[str, ...],
          field_name: str) -> tuple[str, tuple[str, str], list[tuple[str, dict[int, tuple[TrialRecord, TrialRecord]]]]]:
    """The compared field (resolved), its two values (a, b; vanilla ``none`` first) and, per combination of
    the other grouping fields, its label and the trials of a and b paired by seed."""
    field_name = field_aliases().get(field_name, field_name)
    check(field_name in by, f"compare: got {field_name!r}; it must be one of the by (--by) fields ({', '.join(by)})")
    index = by.index(field_name)
    values = sorted({k[index] for k in groups}, key=lambda v: (v != "none", v))
    check(len(values) == 2, f"compare: {field_name} takes {len(values)} value(s) here ({', '.join(values)}); "
                            f"a paired comparison needs exactly two")
    rest = tuple(f for f in by if f != field_name)
    out = []
    for other in sorted({k[:index] + k[index + 1:] for k in groups}):
        key_a, key_b = (other[:index] + (v,) + other[index:] for v in values)
        if key_a not in groups or key_b not in groups:
            continue
        a = {m.seed: m for m in groups[key_a]}
        b = {m.seed: m for m in groups[key_b]}
        out.append((label_of(rest, other), {s: (a[s], b[s]) for s in sorted(set(a) & set(b))}))
    return field_name, (values[0], values[1]), out


def compare_groups(groups: dict[tuple[str, ...], list[TrialRecord]], by: tuple[str, ...], field_name: str,
                   metrics: list[str], seed: int = 0) -> list[Comparison]:
    """Paired permutation tests between the two values of ``field_name`` (e.g. pe: none vs sinusoidal),
    within each combination of the other grouping fields, pairing trials by seed. Effect = b − a."""
    field_name, (va, vb), paired = _arms(groups, by, field_name)
    out = []
    for label, pairs in paired:
        if len(pairs) < 2:
            continue
        for metric in metrics:
            xa = np.array([a.metrics.get(metric, np.nan) for a, _ in pairs.values()])
            xb = np.array([b.metrics.get(metric, np.nan) for _, b in pairs.values()])
            out.append(Comparison(label, metric, va, vb, paired_permutation_test(xb, xa, seed=seed)))
    if not out:
        raise GradscopeError(f"compare: no pair of groups shares at least two seeds across {field_name}="
                             f"{va} and {vb}")
    return out


def _differences(pairs: dict[int, tuple[TrialRecord, TrialRecord]], metric: str,
                 seeds: list[int] | None = None) -> np.ndarray:
    """b − a of ``metric`` for each paired seed (``seeds``: these, in this order), float64; NaN where missing."""
    chosen = [pairs[s] for s in seeds] if seeds is not None else list(pairs.values())
    return np.array([b.metrics.get(metric, np.nan) - a.metrics.get(metric, np.nan) for a, b in chosen],
                    dtype=np.float64)


def compare_over_training(records: list[TrialRecord], by: tuple[str, ...], field_name: str, metrics: list[str], *,
                          method: str = INTERVAL, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                          seed: int = 0, margin: float = EQUIVALENCE_MARGIN) -> list[TrainingComparison]:
    """Two arms over seeds and training checkpoints (records of every checkpoint: ``trial_records(...,
    checkpoints="all")``). Within each combination of the other ``by`` fields and for each metric: at every
    iteration, the interval (``method``) of the per-seed differences b − a over the seeds both arms have
    there; then :func:`gradscope.analysis.trend.trend_test` between the first and the last iteration that
    every paired seed has (the seed-level test of whether the gap opens; ``margin``: its equivalence margin)."""
    check(bool(records), "stores: nothing to summarize")
    check(all(r.iteration is not None for r in records),
          "stores: a store records no training iterations; compare over training needs them")
    at: dict[int, list[TrialRecord]] = {}
    for r in records:
        at.setdefault(int(r.iteration), []).append(r)  # type: ignore[arg-type]
    per_iteration = {it: _arms(group_records(rs, by), by, field_name) for it, rs in sorted(at.items())}
    field_name, (va, vb) = next(iter(per_iteration.values()))[:2]
    labels = list(dict.fromkeys(label for _, _, paired in per_iteration.values() for label, _ in paired))
    out = []
    for label in labels:
        pairs_at = {it: dict(paired).get(label, {}) for it, (_, _, paired) in per_iteration.items()}
        seeds = sorted({s for pairs in pairs_at.values() for s in pairs})
        shared = [it for it, pairs in pairs_at.items() if seeds and all(s in pairs for s in seeds)]
        for metric in metrics:
            points = []
            for it, pairs in pairs_at.items():
                if not pairs:
                    continue
                diffs = _differences(pairs, metric)
                interval = confidence_interval(diffs, method=method, confidence=confidence, resamples=resamples,
                                               seed=seed)
                points.append(TrainingPoint(it, interval, tuple(pairs), tuple(float(d) for d in diffs)))
            if len(shared) < 2 or len(seeds) < 2:
                note = (f"no test: only {len(seeds)} seed(s) have both arms" if len(seeds) < 2 else
                        "no test: the paired seeds share fewer than two checkpoints")
                out.append(TrainingComparison(label, metric, va, vb, tuple(points), None, None, None, note))
                continue
            first, last = shared[0], shared[-1]
            test = trend_test(_differences(pairs_at[first], metric, seeds), _differences(pairs_at[last], metric, seeds),
                              margin=margin, confidence=confidence, resamples=resamples,
                              seed=seed)
            later = [it for it, pairs in pairs_at.items() if it > last and pairs]
            note = (f"tested at iterations {first} and {last}, the last every seed pair has; some stores go on to "
                    f"{later[-1]}" if later else "")
            out.append(TrainingComparison(label, metric, va, vb, tuple(points), first, last, test, note))
    if not out:
        raise GradscopeError(f"compare: no pair of groups shares a seed across {field_name}={va} and {vb}")
    return out


def select_metrics(available: list[str], requested: list[str] | tuple[str, ...] | None, kind: str) -> list[str]:
    """The metrics shown: ``requested`` (``all``: every one), else the main ones of the kind (stability: the
    same-target scores; accuracy: all but the per-bin grid values)."""
    if requested and "all" in requested:
        return available
    if requested:
        return [m for m in requested if m in available]
    if kind == "stability":
        return [m for m in available if m.startswith("stability/same-target/")]
    return [m for m in available if "/bin" not in m]


def few_trials(entries: list[SummaryEntry]) -> bool:
    return any(e.interval.n < FEW_TRIALS for e in entries)


def summarize(source: Any, *, opts: SummarizeOptions | None = None, **overrides: Any) -> xr.Dataset:
    """Seeds as trials: the mean and confidence interval of every metric per group of stores, as the
    summary store's Dataset: ``mean``, ``low``, ``high``, ``n``, ``nan`` over (group, metric), the
    per-seed ``values`` and ``seed``, and a ``label`` and one coordinate per ``by`` field on ``group``.
    ``ds.to_dataframe()`` (or ``ds[["mean", "low", "high", "n"]].to_dataframe()``) is the table
    ``gradscope summarize`` prints, from the same numbers. opts: :class:`SummarizeOptions` (None: the defaults);
    overrides: any of its fields, named as the command's flags.

    source: a store path, a sweep directory, a folder of stores or a quoted wildcard, or a list of
    them; stores of one kind (accuracy or stability), or ``kind`` to pick one.
    by: config fields to group by (comma-separated or a tuple), named as gradscope train's settings (core, pe,
    vocab_size, hidden_size, …) or by their short names (model, vocab, hidden, …).
    interval: the interval method (percentile, bca, basic, t).
    compare with checkpoints="all": two arms (e.g. ``compare="pe"``) over seeds and training checkpoints, for
    the ``metric`` chosen (default: the main ones): the dataset also holds, per contrast, metric and
    iteration, the seed-level interval of the difference (``diff_mean``, ``diff_low``, ``diff_high``,
    ``diff_n``, ``diff_values``), and per contrast and metric the test of whether it opens (``gap_*``,
    ``change_*``, ``verdict``; :func:`gradscope.analysis.trend.trend_test`). The main table is at each
    store's last checkpoint either way.
    """
    opts = with_overrides(SummarizeOptions, opts, overrides, "summarize")  # every value checked there
    plan = plan_summary(source, opts)
    attrs = summary_attrs("", plan.fields, opts.unit, opts.interval, opts.ci, opts.resamples,
                          [r.path for r in plan.records], plan.kind)
    return plan.dataset(attrs)


@dataclass(frozen=True)
class SummaryPlan:
    """One kind's summary, computed: its trials, grouping fields, entries (at each store's last
    checkpoint), the metrics shown, and the comparison asked for (between groups at the last checkpoint,
    or over training)."""

    kind: str
    fields: tuple[str, ...]
    records: list[TrialRecord]
    entries: list[SummaryEntry]
    shown: list[str]
    compare: str | None
    comparisons: list[Comparison] | None
    training: list[TrainingComparison] | None

    def dataset(self, attrs: dict[str, Any]) -> xr.Dataset:
        """The summary store's dataset (with the comparison over training, when there is one)."""
        ds = summary_dataset(self.entries, self.fields, attrs)
        if self.training:
            extra = training_dataset(self.training, str(self.compare))
            ds = xr.merge([ds, extra], combine_attrs="drop_conflicts")
            ds.attrs.update({"compare": str(self.compare), "margin": extra.attrs["margin"]})
        return ds


def plan_summary(source: Any, opts: SummarizeOptions, *, kind: str | None = None) -> SummaryPlan:
    """Read the stores of ``source`` (of ``kind``, when several kinds are there) and compute ``opts``'
    summary, without writing anything."""
    fields = parse_by(opts.by)
    patterns = [str(source)] if isinstance(source, (str, Path)) else [str(s) for s in source]
    kind = kind or opts.kind
    paths = expand_store_paths(patterns, kind)
    if kind is not None:  # stores of the other kind are not read (their metadata says which; unreadable: read)
        paths = [p for p in paths if store_kind(p) in (kind, None)]
    every = opts.checkpoints == "all"
    records = [r for p in paths for r in trial_records(p, opts.score, opts.checkpoints)
               if kind is None or r.kind == kind]
    check(bool(records), f"stores: none of them is a {kind} store")
    if every:  # the main table stays at each store's last checkpoint
        last = {}
        for r in records:
            last[(r.path, r.seed, tuple(sorted(r.fields.items())))] = r
        all_records, records = records, list(last.values())
    kinds = sorted({r.kind for r in records})
    check(len(kinds) == 1, f"kind: the stores are of kinds {' and '.join(kinds)}; pass kind= to summarize one")
    groups = group_records(records, fields)
    metrics = list(dict.fromkeys(m for r in records for m in r.metrics))
    entries = summarize_groups(groups, fields, metrics, unit=opts.unit, method=opts.interval, confidence=opts.ci,
                               resamples=opts.resamples, seed=opts.seed)
    requested = list(opts.metric) or None
    if requested and "all" not in requested:
        unknown = [m for m in requested if m not in metrics]
        check(not unknown, f"metric: got {unknown[0] if unknown else ''!r}; available: {', '.join(sorted(metrics))}")
    shown = [m for m in select_metrics(metrics, requested, kinds[0]) if any(e.metric == m for e in entries)]
    comparisons = training = None
    if opts.compare is not None and shown:
        if every:
            training = compare_over_training(all_records, fields, opts.compare, shown, method=opts.interval,
                                             confidence=opts.ci, resamples=opts.resamples, seed=opts.seed,
                                             margin=opts.margin)
        else:
            comparisons = compare_groups(groups, fields, opts.compare, shown, opts.seed)
    return SummaryPlan(kinds[0], fields, records, entries, shown, opts.compare, comparisons, training)
