"""`gradscope summarize`: parse → read trials → gradscope.workflows.summarize → table + zarr/CSV."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape  # store labels and paths are text, never markup

from gradscope.errors import GradscopeError
from gradscope.workflows.options import SummarizeOptions  # torch-free: --help builds the options from it

from .common import SETTINGS, command_line, default_out, make_console, old_name, refuse_given
from .errors import user_errors
from .generated import build_options, generated_command

if TYPE_CHECKING:
    from gradscope.store.records import SummaryEntry, TrialRecord
    from gradscope.workflows.summarize import Comparison
    from rich.table import Table

console = make_console()
Opt = typer.Option


def _num(x: float) -> str:
    return "nan" if x != x else f"{x:.3f}"


def n_text(e: SummaryEntry, kind: str, unit: str = "trial") -> str:
    """Values used, and what was NaN and left out, counted, never averaged in silently: trials
    (+k NaN) and, with the trial unit, the units within the trials (stability: triplets)."""
    iv, name = e.interval, "triplet" if kind == "stability" else "unit"
    within = e.nan_units if unit == "trial" else 0  # with the token unit, iv.nan counts the units themselves
    parts = [f"+{iv.nan} NaN"] * bool(iv.nan) + [f"{within} NaN {name}{'s' * (within != 1)}"] * bool(within)
    return f"{iv.n} ({'; '.join(parts)})" if parts else str(iv.n)


def summary_table(entries: list[SummaryEntry], confidence: float, method: str, unit: str, kind: str = "") -> Table:
    from rich.table import Table

    title = f"{kind} " if kind else ""
    table = Table(title=f"{title}mean [{confidence:.0%} CI, {method}, unit = {unit}]", title_justify="left")
    width = min(60, max((len(e.metric) for e in entries), default=6))  # metric names are never cut short
    for col in ("group", "metric", "mean [CI]", "n", "per-seed values"):
        table.add_column(col, justify="right" if col in ("n",) else "left",
                         **({"min_width": width, "no_wrap": True} if col == "metric" else {}))
    last = None
    for e in entries:
        iv = e.interval
        note = f"  ({iv.note.split(':')[0]})" if iv.note and "degenerate" in iv.note else ""
        ci = f"[{_num(iv.low)}, {_num(iv.high)}]" if iv.n >= 2 else "[no CI]"  # one value has no interval (n says 1)
        table.add_row(escape(e.label) if e.label != last else "", escape(e.metric),
                      escape(f"{_num(iv.mean)} {ci}{note}"), n_text(e, kind, unit),
                      " ".join(f"{s}:{_num(v)}" for s, v in zip(e.seeds, e.values)))
        last = e.label
    return table


def comparison_table(comparisons: list[Comparison], field: str) -> Table:
    from rich.table import Table

    table = Table(title=f"paired permutation test by seed: {field} = b − a", title_justify="left")
    for col in ("group", "metric", "a → b", "mean diff", "effect d_z", "p (two-sided)", "pairs"):
        table.add_column(col)
    for c in comparisons:
        r = c.result
        table.add_row(escape(c.label), escape(c.metric), escape(f"{c.a} → {c.b}"), f"{r.mean_diff:+.4f}",
                      _num(r.effect_size), f"{r.pvalue:.4f}", str(r.n_a))
    notes = sorted({c.result.note for c in comparisons if c.result.note})
    if notes:
        table.caption = "; ".join(notes)
        table.caption_justify = "left"
    return table


# the grouping and resampling options (each --<field>, its help and default from SummarizeOptions' field)
SummarizeCommand = generated_command(SummarizeOptions)


@user_errors
def summarize_command(
    ctx: typer.Context,
    stores: Annotated[list[str], typer.Argument(help="Accuracy or stability stores (one per trial/seed), sweep directories, or folders of stores; quoted wildcards are expanded. Each kind is summarized separately.", show_default=False)],
    out: Annotated[Optional[Path], Opt("--out", "-o", help="Summary zarr store (default: summary-<kind>.zarr). With both kinds: <stem>-<kind>.zarr each.")] = None,
    csv: Annotated[Optional[Path], Opt(help="Also write the table as CSV (with both kinds: <stem>-<kind>.csv each).")] = None,
    overwrite: Annotated[bool, Opt(help="Replace an existing store or CSV.")] = False,
    # --interval's name before issue #39 (stability's --method is the Jacobian engine), hidden; it warns
    method: Annotated[Optional[str], Opt("--method", hidden=True, help="Deprecated: the old name of --interval; it will be removed.")] = None,
) -> None:
    """Combine stores of several runs: group by config, treat seeds as trials, bootstrap CIs."""
    from gradscope.store.summary import expand_store_paths, trial_records
    from gradscope.workflows.summarize import parse_by

    settings = dict(ctx.meta.get(SETTINGS, {}))
    old_name(ctx, settings, method, "method", "interval", "stability's --method is the Jacobian engine")
    opts = build_options(SummarizeOptions, settings)  # every value checked in its __post_init__
    kind, unit, resamples, ci, method = opts.kind, opts.unit, opts.resamples, opts.ci, opts.interval
    metric, score, compare, seed = list(opts.metric) or None, opts.score, opts.compare, opts.seed
    fields = parse_by(opts.by)
    paths = expand_store_paths(stores, kind)
    records = [r for p in paths for r in trial_records(p, score)]
    kinds = list(dict.fromkeys(r.kind for r in records))
    if "stability" not in kinds:
        refuse_given(ctx, ["score"], "it chooses the stability score, and these stores hold no stability results")
    targets = {k: (_per_kind(out, k, kinds, "--out") if out is not None else None,
                   _per_kind(csv, k, kinds, "--csv") if csv is not None else None) for k in kinds}
    for store_path, csv_path in targets.values():  # refuse before any work; writing refuses again, atomically
        for flag, path in (("--out", store_path), ("--csv", csv_path)):
            if path is not None and (path.exists() or path.is_symlink()) and not overwrite:
                raise GradscopeError(f"{flag}: {path} already exists; choose another path or pass --overwrite")
            if path is not None and not path.parent.is_dir():
                raise GradscopeError(f"{flag}: directory {path.parent} does not exist")
            if flag == "--out" and path is not None and path.exists() and not path.is_dir():
                raise GradscopeError(f"--out: {path} is a file; a store is a directory, choose another path")
    if metric and "all" not in metric:
        known = {m for r in records for m in r.metrics}
        unknown = [m for m in metric if m not in known]
        if unknown:
            raise GradscopeError(f"--metric: got {unknown[0]!r}; available: {', '.join(sorted(known))}")
    plans = [_plan([r for r in records if r.kind == k], k, fields, targets[k], unit=unit, method=method, ci=ci,
                   resamples=resamples, metric=metric, compare=compare, seed=seed) for k in kinds]
    for plan in plans:  # every kind computed before anything is shown or written
        _show(plan, fields, ci, method, unit)
    created: list[Path] = []
    try:
        for plan in plans:
            _write(ctx, plan, fields, unit, method, ci, resamples, overwrite, created)
    except GradscopeError:
        for path in created:  # nothing half-done: what this run created goes again
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        raise


def _per_kind(path: Path, kind: str, kinds: list[str], flag: str) -> Path:
    """``path`` itself for one kind; ``<stem>-<kind><suffix>`` beside it when several kinds are summarized."""
    if path.is_dir() and not path.is_symlink() and flag == "--csv":
        raise GradscopeError(f"--csv: {path} is a directory; give a file path")
    return path if len(kinds) == 1 else path.with_name(f"{path.stem}-{kind}{path.suffix}")


@dataclass
class _Plan:
    """One kind's summary, computed: its trials, groups, entries, the metrics shown, the comparison."""

    kind: str
    records: list[TrialRecord]
    entries: list[SummaryEntry]
    shown: list[str]
    comparisons: list[Comparison] | None
    compare: str | None
    target: tuple[Path | None, Path | None]


def _plan(records: list[TrialRecord], kind: str, fields: tuple[str, ...], target: tuple[Path | None, Path | None], *,
          unit: str, method: str, ci: float, resamples: int, metric: list[str] | None, compare: str | None,
          seed: int) -> _Plan:
    from gradscope.workflows.summarize import compare_groups, group_records, summarize_groups

    groups = group_records(records, fields)
    all_metrics = list(dict.fromkeys(m for r in records for m in r.metrics))
    entries = summarize_groups(groups, fields, all_metrics, unit=unit, method=method, confidence=ci,
                               resamples=resamples, seed=seed)
    shown = [m for m in _select_metrics(all_metrics, metric, kind) if any(e.metric == m for e in entries)]
    comparisons = compare_groups(groups, fields, compare, shown, seed) if compare is not None and shown else None
    return _Plan(kind, records, entries, shown, comparisons, compare, target)


def _show(plan: _Plan, fields: tuple[str, ...], ci: float, method: str, unit: str) -> None:
    from gradscope.analysis.bootstrap import FEW_TRIALS
    from gradscope.workflows.summarize import few_trials, unmatched_fields

    entries = plan.entries
    console.print(summary_table([e for e in entries if e.metric in plan.shown], ci, method, unit, plan.kind))
    if unit == "trial" and method != "t" and few_trials(entries):  # (with --interval t there is nothing to advise)
        console.print(f"[yellow]note: fewer than {FEW_TRIALS} trials per group. With 5 seeds there are only 126 "
                      f"distinct resamples, and percentile intervals covered ~86% (not 95%) in a simulation here; "
                      f"read them as rough, or use --interval t.[/]")
    nan = sum(e.nan_units for e in entries if e.metric in plan.shown)
    if nan:
        console.print(f"[yellow]note: {nan} NaN value(s) were left out of the means above; column n counts them.[/]")
    differing = unmatched_fields(plan.records, fields)
    if differing:
        console.print(f"[yellow]note: stores differ in {', '.join(differing)}, which --by does not group on.[/]")
    if plan.comparisons is not None and plan.compare is not None:
        console.print(comparison_table(plan.comparisons, plan.compare))


def _write(ctx: typer.Context, plan: _Plan, fields: tuple[str, ...], unit: str, method: str, ci: float,
           resamples: int, overwrite: bool, created: list[Path]) -> None:
    """The summary store, then the CSV; each path this creates is appended to ``created``."""
    from gradscope.store.io import write_store
    from gradscope.store.summary import summary_attrs, summary_dataset, write_csv

    store_path, csv_path = plan.target
    out_path = store_path if store_path is not None else default_out("summary", Path(plan.kind))
    attrs = summary_attrs(command_line(ctx), fields, unit, method, ci, resamples, [r.path for r in plan.records],
                          plan.kind)
    existed = out_path.exists()
    write_store(summary_dataset(plan.entries, fields, attrs), out_path, overwrite=overwrite)
    if not existed:
        created.append(out_path)
    if csv_path is not None:
        existed = csv_path.exists()
        write_csv([e for e in plan.entries if e.metric in plan.shown], csv_path, overwrite=overwrite)
        if not existed:
            created.append(csv_path)
    console.print(escape(f"wrote {out_path}" + (f" and {csv_path}" if csv_path is not None else "")))


def _select_metrics(available: list[str], requested: list[str] | None, kind: str) -> list[str]:
    if requested and "all" in requested:
        return available
    if requested:
        return [m for m in requested if m in available]
    if kind == "stability":
        return [m for m in available if m.startswith("stability/same-target/")]
    return [m for m in available if "/bin" not in m]
