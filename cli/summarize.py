"""`gradscope summarize`: parse → read trials → gradscope.workflows.summarize → table + zarr/CSV."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape  # store labels and paths are text, never markup

from gradscope.errors import GradscopeError
from gradscope.workflows.options import UNITS, SummarizeOptions  # torch-free: --help builds the options from it

from .common import SETTINGS, command_line, default_out, make_console, refuse_given
from .errors import user_errors
from .generated import build_options, generated_command

if TYPE_CHECKING:
    from gradscope.store.records import SummaryEntry, TrainingComparison
    from gradscope.workflows.summarize import Comparison, SummaryPlan
    from rich.table import Table

console = make_console()
Opt = typer.Option


def _num(x: float) -> str:
    return "nan" if x != x else f"{x:.3f}"


def n_text(e: SummaryEntry, kind: str, unit: str = UNITS[0]) -> str:
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


def training_tables(comparisons: list[TrainingComparison], field: str, confidence: float, method: str
                    ) -> list[Table]:
    """Per contrast and metric: the seed-level difference b − a at every checkpoint; then the test of
    whether it opens, one row per contrast and metric."""
    from rich.table import Table

    tables = []
    for c in comparisons:
        table = Table(title=f"{c.metric}, {c.label}: {field} = {c.b} − {c.a} over training, seeds as trials "
                            f"[{confidence:.0%} CI, {method}]", title_justify="left")
        for col in ("iteration", "mean diff [CI]", "n", "per-seed differences"):
            table.add_column(col, justify="right" if col in ("iteration", "n") else "left")
        for point in c.points:
            iv = point.interval
            ci = f"[{_num(iv.low)}, {_num(iv.high)}]" if iv.n >= 2 else "[no CI]"
            table.add_row(str(point.iteration), f"{iv.mean:+.3f} {ci}", str(iv.n),
                          " ".join(f"{s}:{d:+.3f}" for s, d in zip(point.seeds, point.differences)))
        tables.append(table)
    for label in dict.fromkeys(c.label for c in comparisons):
        tables.append(_test_table([c for c in comparisons if c.label == label], field))
    return tables


def _test_table(comparisons: list[TrainingComparison], field: str) -> Table:
    """The test of whether the gap opens, for one group of the other fields: two rows per metric."""
    from rich.table import Table

    from gradscope.analysis.trend import VERDICT_TEXT

    c0 = comparisons[0]
    spans = sorted({(c.first, c.last) for c in comparisons if c.test is not None})
    span = f" (iterations {', '.join(f'{a} → {b}' for a, b in spans)})" if spans else ""
    names = [c.metric for c in comparisons]
    prefix = os.path.commonprefix(names)
    if not all(len(n) > len(prefix) for n in names):  # one metric: keep its last two parts (rare/rare)
        prefix = prefix[:prefix.rfind("/", 0, prefix.rfind("/")) + 1]
    prefix = prefix[:prefix.rfind("/") + 1]
    table = Table(title=f"does {field} = {c0.b} − {c0.a} open with training? {c0.label}{span}"
                        f"{f', metrics {prefix}…' if prefix else ''}; seeds paired; the t-intervals decide, the "
                        f"bootstrap and sign-flip test are shown beside", title_justify="left")
    width = min(60, max(len(n) - len(prefix) for n in names))
    table.add_column("metric", min_width=width, no_wrap=True)
    for col in ("statistic", "mean [t CI]", "p (t)", "bootstrap CI", "p (sign)", "outcome"):
        table.add_column(col, justify="right" if col.startswith("p ") else "left", no_wrap=True)
    for c in comparisons:
        if c.test is None:
            table.add_row(escape(c.metric[len(prefix):]), "", "", "", "", "", escape(c.note))
            continue
        for name, stat in (("gap at last", c.test.gap), ("change", c.test.change)):
            first = name == "gap at last"
            table.add_row(escape(c.metric[len(prefix):]) if first else "", name,
                          f"{stat.t.mean:+.3f} [{_num(stat.t.low)}, {_num(stat.t.high)}]", f"{stat.t_p:.4f}",
                          f"[{_num(stat.bootstrap.low)}, {_num(stat.bootstrap.high)}]", f"{stat.sign_p:.4f}",
                          VERDICT_TEXT[c.test.verdict] if first else "")
    margin = next((c.test.margin for c in comparisons if c.test is not None), None)
    notes = sorted({c.note for c in comparisons if c.note and c.test is not None})
    if margin is not None:
        table.caption = (f"gap: {c0.b} − {c0.a} at the last checkpoint tested; change: that gap minus the gap at the "
                         f"first. Outcome: 'the gap opens' if both t-intervals lie above 0, 'the opposite' if both "
                         f"lie below, 'no effect' if both lie inside ±{margin:g} (--margin), else 'not settled'"
                         + "".join(f"; {n}" for n in notes))
        table.caption_justify = "left"
    return table


@user_errors
def summarize_command(
    ctx: typer.Context,
    stores: Annotated[list[str], typer.Argument(help="Accuracy or stability stores (one per trial/seed), sweep directories, or folders of stores; quoted wildcards are expanded. Each kind is summarized separately.", show_default=False)],
    out: Annotated[Optional[Path], Opt("--out", "-o", help="Summary zarr store (default: summary-<kind>.zarr). With both kinds: <stem>-<kind>.zarr each.")] = None,
    csv: Annotated[Optional[Path], Opt(help="Also write the table as CSV (with both kinds: <stem>-<kind>.csv each).")] = None,
    overwrite: Annotated[bool, Opt(help="Replace an existing store or CSV.")] = False,
) -> None:
    """Combine stores of several runs: group by config, treat seeds as trials, bootstrap CIs; with
    --checkpoints all --compare FIELD, two arms over training with a seed-level test."""
    from gradscope.store.summary import expand_store_paths, store_kinds
    from gradscope.workflows.summarize import plan_summary

    settings = dict(ctx.meta.get(SETTINGS, {}))
    opts = build_options(SummarizeOptions, settings)  # every value checked in its __post_init__
    kinds = store_kinds(expand_store_paths(stores, opts.kind))
    if "stability" not in kinds:
        refuse_given(ctx, ["score"], "it chooses the stability score, and these stores hold no stability results")
    if opts.compare is None:
        refuse_given(ctx, ["margin"], "it is the margin of the test over training, which needs --compare")
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
    plans = [plan_summary(stores, opts, kind=k) for k in kinds]
    for plan in plans:  # every kind computed before anything is shown or written
        _show(plan, opts.ci, opts.interval, opts.unit)
    created: list[Path] = []
    try:
        for plan in plans:
            _write(ctx, plan, targets[plan.kind], opts, overwrite, created)
    except GradscopeError:
        for path in created:  # nothing half-done: what this run created goes again
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        raise


def _per_kind(path: Path, kind: str, kinds: list[str], flag: str) -> Path:
    """``path`` itself for one kind; ``<stem>-<kind><suffix>`` beside it when several kinds are summarized."""
    if path.is_dir() and not path.is_symlink() and flag == "--csv":
        raise GradscopeError(f"--csv: {path} is a directory; give a file path")
    return path if len(kinds) == 1 else path.with_name(f"{path.stem}-{kind}{path.suffix}")


def _show(plan: SummaryPlan, ci: float, method: str, unit: str) -> None:
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
    differing = unmatched_fields(plan.records, plan.fields)
    if differing:
        console.print(f"[yellow]note: stores differ in {', '.join(differing)}, which --by does not group on.[/]")
    if plan.comparisons is not None and plan.compare is not None:
        console.print(comparison_table(plan.comparisons, plan.compare))
    if plan.training is not None and plan.compare is not None:
        for table in training_tables(plan.training, plan.compare, ci, method):
            console.print(table)


def _write(ctx: typer.Context, plan: SummaryPlan, target: tuple[Path | None, Path | None], opts: SummarizeOptions,
           overwrite: bool, created: list[Path]) -> None:
    """The summary store, then the CSV; each path this creates is appended to ``created``."""
    from gradscope.store.io import write_store
    from gradscope.store.summary import summary_attrs, write_csv

    store_path, csv_path = target
    out_path = store_path if store_path is not None else default_out("summary", Path(plan.kind))
    attrs = summary_attrs(command_line(ctx), plan.fields, opts.unit, opts.interval, opts.ci, opts.resamples,
                          [r.path for r in plan.records], plan.kind)
    existed = out_path.exists()
    write_store(plan.dataset(attrs), out_path, overwrite=overwrite)
    if not existed:
        created.append(out_path)
    if csv_path is not None:
        existed = csv_path.exists()
        write_csv([e for e in plan.entries if e.metric in plan.shown], csv_path, overwrite=overwrite)
        if not existed:
            created.append(csv_path)
    console.print(escape(f"wrote {out_path}" + (f" and {csv_path}" if csv_path is not None else "")))
