"""`gradscope stability`: parse → gradscope.workflows.stability → table + zarr store."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from gradscope.errors import GradscopeError
from gradscope.fields import SCORE_KINDS, listed
from gradscope.workflows.options import StabilityOptions  # torch-free: --help builds the options from it

from .common import (SETTINGS, check_out, check_text_source, command_line, default_out, make_console,
                     old_name, refuse_given, warn)
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
        table.add_row(*(Text(cells[c]) for c in extra), str(first.iteration), Text(condition), Text(interval_text(st)),
                      Text(interval_text(ss)), str(st.n), str(st.nan + ss.nan))
    return table


# the probe options (each --<field>, its help and default from StabilityOptions' field) are generated
StabilityCommand = generated_command(StabilityOptions)


@user_errors
def stability_command(
    ctx: typer.Context,
    checkpoints: Annotated[list[Path], typer.Argument(help="Checkpoint files and/or run directories (every checkpoint of a run, oldest first).", show_default=False)],
    score: Annotated[str, Opt(help=f"Score shown in the table: {listed(SCORE_KINDS)} (all are stored).")] = "default",
    out: Annotated[Optional[Path], Opt("--out", "-o", help="Zarr store to write (default: stability-<name>.zarr).")] = None,
    overwrite: Annotated[bool, Opt(help="Replace an existing store.")] = False,
    resamples: Annotated[int, Opt(help="Bootstrap resamples for the CIs.")] = 10_000,
    model_factory: Annotated[Optional[str], Opt("--model-factory", "--model", help="Your own model: FILE.py:FUNC or package.module:FUNC, where FUNC(checkpoint_path) returns gradscope.wrap(...) (runs your code: see the README's trust note); or hf[:CLASS]: a transformers model from a save_pretrained directory, or from a weights file with --config (docs/models-from-libraries.md).")] = None,
    config: Annotated[Optional[Path], Opt("--config", help="With --model-factory hf:CLASS and a weights file: the model's config.json.")] = None,
    text: Annotated[Optional[Path], Opt(help="With --model hf: probes drawn from this raw UTF-8 text, tokenised with the model's own tokenizer; groups by frequency in the text (docs/real-text.md). --length is then the probe row's length, start token included (default 32).")] = None,
    counts_text: Annotated[Optional[Path], Opt(help="With --text: a (larger) text whose token counts define the frequency groups (default: --text).")] = None,
    tokenizer: Annotated[Optional[Path], Opt(help="With --text: the folder of the model's tokenizer (default: the model's directory).")] = None,
    quiet: Annotated[bool, Opt("--quiet", "-q", help="No progress bar.")] = False,
    # --checkpoint-budget-seconds' name before issue #39 (dynamics' --budget-seconds is the whole command's), hidden
    budget_seconds: Annotated[Optional[float], Opt("--budget-seconds", hidden=True, help="Deprecated: the old name of --checkpoint-budget-seconds; it will be removed.")] = None,
) -> None:
    """Gradient stability of checkpoints: J = ∂h_2L/∂z_p on probe triplets, scored pairwise (docs/definitions.md §4).
    The probe options (--target-freq … --checkpoint-budget-seconds) are StabilityOptions' fields."""
    import warnings

    from gradscope.analysis.bootstrap import check_resamples
    from gradscope.store.io import write_store
    from gradscope.workflows.factory import build_model
    from gradscope.workflows.common import DivergedWarning
    from gradscope.workflows.stability import run_model_stability, run_stability

    # every probe option is checked in StabilityOptions.__post_init__, before anything else
    settings = dict(ctx.meta.get(SETTINGS, {}))
    old_name(ctx, settings, budget_seconds, "budget_seconds", "checkpoint_budget_seconds",
             "dynamics' --budget-seconds is the whole command's")
    opts = build_options(StabilityOptions, settings)
    check_resamples(resamples)
    check_text_source(ctx, "stability", text, model_factory, config, ["token_counts", "probes", "filler"],
                      "with --text the probes are drawn from the text")
    if model_factory is None and (opts.token_counts is not None or opts.filler is not None):
        raise GradscopeError("--token-counts/--filler: they describe probes for --model-factory models; "
                             "gradscope checkpoints generate their own")
    if model_factory is not None:
        refuse_given(ctx, ["corpus"], "it names an lm checkpoint's corpus; a --model-factory model has none")
    out_path = out if out is not None else default_out("stability", checkpoints[0] if checkpoints else Path("x"))
    check_out(out_path, overwrite)
    with make_progress(console) as progress, warnings.catch_warnings():
        warnings.simplefilter("ignore", DivergedWarning)  # said below, in one line
        bar = progress.add_task("jacobians", total=None, visible=False)  # shown once the plan accepts the work

        def show() -> None:
            progress.update(bar, visible=not quiet)

        hooks = {"on_start": lambda total: progress.update(bar, total=total),
                 "on_progress": lambda k: (show(), progress.advance(bar, k)),
                 "on_plan": lambda plan: (progress.console.print(plan.note, markup=False, highlight=False), show())}
        if text is not None:
            from gradscope.workflows.text_probes import TextSource, run_text_stability

            if len(checkpoints) != 1:
                raise GradscopeError("checkpoint: with --text give exactly one model directory")
            source = TextSource(str(text), None if counts_text is None else str(counts_text),
                                None if tokenizer is None else str(tokenizer))
            run = run_text_stability(checkpoints[0], opts, source, model_factory=model_factory, config=config,
                                     command=command_line(ctx), **hooks)
        elif model_factory is not None:
            if len(checkpoints) != 1:
                raise GradscopeError("checkpoint: with --model-factory give exactly one checkpoint file")
            model = build_model(model_factory, checkpoints[0], config)
            run = run_model_stability(model, opts, source=checkpoints[0], command=command_line(ctx), **hooks)
        else:
            run = run_stability(checkpoints, opts, command=command_line(ctx), **hooks)
    console.print(stability_table(run.summary(score, opts.seed, resamples), score, resamples,
                                  [str(r.path) for r in run.results]))
    write_store(run.to_xarray(), out_path, overwrite=overwrite)
    nan, bad = run.nan_count[score], run.nonfinite_jacobians
    if nan:
        why = (f"{bad} Jacobians have NaN or Inf entries: a diverged model?" if bad else "an all-zero Jacobian")
        warn(f"{nan} NaN {score} scores ({why}) are counted in the NaN column and left out of the means")
    console.print(f"wrote {out_path}")
