"""`gradscope stability`: parse → gradscope.workflows.stability → table + zarr store."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from gradscope.workflows.options import SourceOptions, StabilityOptions, TableOptions  # torch-free (--help)

from .common import SETTINGS, check_out, command_line, default_out, make_console, warn
from .errors import user_errors
from .generated import build_options, generated_command
from .progress import make_progress

if TYPE_CHECKING:
    from rich.table import Table
    from gradscope.analysis.bootstrap import Interval
    from gradscope.workflows.stability import SummaryRow

console = make_console()
Opt = typer.Option


def fmt(x: float) -> str:
    return "nan" if x != x else f"{x:.3f}"


def interval_text(iv: Interval) -> str:
    """'mean [low, high]' with three decimals; 'nan' where undefined."""
    return f"{fmt(iv.mean)} [{fmt(iv.low)}, {fmt(iv.high)}]"


def stability_table(rows: list[SummaryRow], kind: str, resamples: int, files: list[str] | None = None) -> Table:
    """One row per checkpoint × condition; both pairs side by side. Checkpoints of several models
    or runs get a model and a run column (and their file names where those still coincide)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"gradient stability, {kind} score: mean [95% CI] over triplets "
                        f"({resamples} bootstrap resamples)", title_justify="left")
    labels = {r.checkpoint: (r.model, r.run, r.iteration) for r in rows}
    extra = [name for i, name in enumerate(("model", "run")) if len({v[i] for v in labels.values()}) > 1]
    if files and len(set(labels.values())) < len(labels):
        extra.append("file")
    for col in (*extra, "iteration", "target/disturbant", "same-target", "same-suffix", "n", "NaN"):
        table.add_column(col, justify="left" if col in ("model", "run", "file") or col.startswith("target")
                         else "right", no_wrap=True)
    by_key: dict[tuple[int, str], dict[str, SummaryRow]] = {}
    for row in rows:
        by_key.setdefault((row.checkpoint, row.condition), {})[row.pair] = row
    for (checkpoint, condition), pairs in by_key.items():
        st, ss = pairs["same-target"].interval, pairs["same-suffix"].interval
        first = pairs["same-target"]
        cells = {"model": first.model, "run": first.run, "file": files[checkpoint] if files else ""}
        # Text, not markup: rich would take "[nan, nan]" (and a label from a probes file) for a style tag
        iteration = str(first.iteration) if first.iteration >= 0 else "–"  # a library or factory model has none
        table.add_row(*(Text(cells[c]) for c in extra), iteration, Text(condition), Text(interval_text(st)),
                      Text(interval_text(ss)), str(st.n), str(st.nan + ss.nan))
    return table


# every option but -o, --overwrite and -q is generated: the source's (SourceOptions), the probes' (StabilityOptions)
# and the table's (TableOptions), each --<field> with its help and default from the field
StabilityCommand = generated_command(StabilityOptions, None, TableOptions, SourceOptions)


@user_errors
def stability_command(
    ctx: typer.Context,
    checkpoints: Annotated[list[Path], typer.Argument(help="Checkpoint files and/or run directories (every checkpoint of a run, oldest first); with --model-factory or --text, one file or directory.", show_default=False)],
    out: Annotated[Optional[Path], Opt("--out", "-o", help="Zarr store to write (default: stability-<name>.zarr).")] = None,
    overwrite: Annotated[bool, Opt(help="Replace an existing store.")] = False,
    quiet: Annotated[bool, Opt("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Gradient stability of checkpoints: J = ∂h_2L/∂z_p on probe triplets, scored pairwise (docs/definitions.md §4).
    The options are the fields of StabilityOptions, SourceOptions and TableOptions."""
    import warnings

    from gradscope.store.io import write_store
    from gradscope.workflows.api import run_stability
    from gradscope.workflows.common import DivergedWarning
    from gradscope.workflows.sources import source_of

    settings = ctx.meta.get(SETTINGS, {})  # every value checked in the dataclasses' __post_init__, first
    table, opts = build_options(TableOptions, settings), build_options(StabilityOptions, settings)
    source = source_of(checkpoints, build_options(SourceOptions, settings))
    out_path = out if out is not None else default_out("stability", checkpoints[0] if checkpoints else Path("x"))
    check_out(out_path, overwrite)
    with make_progress(console) as progress, warnings.catch_warnings():
        warnings.simplefilter("ignore", DivergedWarning)  # said below, in one line
        bar = progress.add_task("jacobians", total=None, visible=False)  # shown once the plan accepts the work

        def show() -> None:
            progress.update(bar, visible=not quiet)

        run = run_stability(source, opts, command=command_line(ctx),
                            on_start=lambda total: progress.update(bar, total=total),
                            on_progress=lambda k: (show(), progress.advance(bar, k)),
                            on_plan=lambda plan: (progress.console.print(plan.note, markup=False, highlight=False),
                                                  show()))
    score = table.score
    console.print(stability_table(run.summary(score, opts.seed, table.resamples), score, table.resamples,
                                  [str(r.path) for r in run.results]))
    write_store(run.to_xarray(), out_path, overwrite=overwrite)
    nan, bad = run.nan_count[score], run.nonfinite_jacobians
    if nan:
        why = (f"{bad} Jacobians have NaN or Inf entries: a diverged model?" if bad else "an all-zero Jacobian")
        warn(f"{nan} NaN {score} scores ({why}) are counted in the NaN column and left out of the means")
    console.print(f"wrote {out_path}")
