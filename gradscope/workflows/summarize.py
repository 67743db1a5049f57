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

from gradscope.analysis.bootstrap import (FEW_TRIALS, PermutationResult, confidence_interval,
                                          paired_permutation_test)
from gradscope.errors import GradscopeError, check
from gradscope.models.registry import core_options
from gradscope.store.records import SummaryEntry, TrialRecord
from gradscope.store.summary import expand_store_paths, summary_attrs, summary_dataset, trial_records
from gradscope.workflows.options import SummarizeOptions, take_renamed

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
                     unit: str = "trial", method: str = "percentile", confidence: float = 0.95,
                     resamples: int = 10_000, seed: int = 0) -> list[SummaryEntry]:
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


def compare_groups(groups: dict[tuple[str, ...], list[TrialRecord]], by: tuple[str, ...], field_name: str,
                   metrics: list[str], seed: int = 0) -> list[Comparison]:
    """Paired permutation tests between the two values of ``field_name`` (e.g. pe: none vs sinusoidal),
    within each combination of the other grouping fields, pairing trials by seed. Effect = b − a."""
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
        common = sorted(set(a) & set(b))
        if len(common) < 2:
            continue
        for metric in metrics:
            xa = np.array([a[s].metrics.get(metric, np.nan) for s in common])
            xb = np.array([b[s].metrics.get(metric, np.nan) for s in common])
            out.append(Comparison(label_of(rest, other), metric, values[0], values[1],
                                  paired_permutation_test(xb, xa, seed=seed)))
    if not out:
        raise GradscopeError(f"compare: no pair of groups shares at least two seeds across {field_name}="
                             f"{values[0]} and {values[1]}")
    return out


def few_trials(entries: list[SummaryEntry]) -> bool:
    return any(e.interval.n < FEW_TRIALS for e in entries)


def summarize(source: Any, *, kind: str | None = None, by: str | tuple[str, ...] = "core,pe,vocab_size",
              unit: str = "trial", resamples: int = 10_000, ci: float = 0.95, interval: str = "percentile",
              score: str = "default", seed: int = 0, method: str | None = None) -> xr.Dataset:
    """Seeds as trials: the mean and confidence interval of every metric per group of stores, as the
    summary store's Dataset: ``mean``, ``low``, ``high``, ``n``, ``nan`` over (group, metric), the
    per-seed ``values`` and ``seed``, and a ``label`` and one coordinate per ``by`` field on ``group``.
    ``ds.to_dataframe()`` (or ``ds[["mean", "low", "high", "n"]].to_dataframe()``) is the table
    ``gradscope summarize`` prints, from the same numbers. Options are named as its flags.

    source: a store path, a sweep directory, a folder of stores or a quoted wildcard, or a list of
    them; stores of one kind (accuracy or stability), or ``kind`` to pick one.
    by: config fields to group by (comma-separated or a tuple), named as gradscope train's settings (core, pe,
    vocab_size, hidden_size, …) or by their short names (model, vocab, hidden, …).
    interval: the interval method (percentile, bca, basic, t); ``method`` is its name before issue #39 (it warns).
    """
    named = {"interval": interval, "method": method}
    take_renamed(named, {"method": "interval"}, "summarize", {"interval": "percentile"})
    opts = SummarizeOptions(kind=kind, by=by, unit=unit, resamples=resamples, ci=ci, interval=named["interval"],
                            score=score, seed=seed)  # every value checked there, as for the command
    fields = parse_by(opts.by)
    patterns = [str(source)] if isinstance(source, (str, Path)) else [str(s) for s in source]
    paths = expand_store_paths(patterns, opts.kind)
    records = [r for p in paths for r in trial_records(p, opts.score)]
    kinds = sorted({r.kind for r in records})
    check(len(kinds) == 1, f"kind: the stores are of kinds {' and '.join(kinds)}; pass kind= to summarize one")
    groups = group_records(records, fields)
    metrics = list(dict.fromkeys(m for r in records for m in r.metrics))
    entries = summarize_groups(groups, fields, metrics, unit=opts.unit, method=opts.interval, confidence=opts.ci,
                               resamples=opts.resamples, seed=opts.seed)
    attrs = summary_attrs("", fields, opts.unit, opts.interval, opts.ci, opts.resamples, [r.path for r in records],
                          kinds[0])
    return summary_dataset(entries, fields, attrs)
