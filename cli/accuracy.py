"""`gradscope accuracy`: parse → gradscope.workflows.accuracy → tables + zarr store."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.markup import escape  # paths are text, never markup

from gradscope.workflows.options import AccuracyOptions, SourceOptions  # torch-free: --help builds the options

from .common import SETTINGS, check_out, command_line, default_out, make_console
from .errors import user_errors
from .generated import build_options, generated_command
from .progress import make_progress

if TYPE_CHECKING:
    from rich.table import Table
    from gradscope.store.records import AccuracyResult

console = make_console()
Opt = typer.Option


def overview_table(results: list[AccuracyResult]) -> Table:
    from rich.table import Table

    table = Table(title="held-out accuracy (uniform test set)", title_justify="left")
    for col in ("iteration", "token accuracy", "sequence full-match", "mean DL distance", "sequences"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(str(r.iteration), f"{r.token_accuracy:.4f}", f"{r.sequence_accuracy:.4f}",
                      f"{r.dl_distance:.3f}", str(r.sequence_scored.size))
    return table


def grid_table(r: AccuracyResult, bins: int | tuple[int, ...]) -> Table:
    from rich.table import Table

    assert r.grid_bin_correct is not None and r.grid_bin_total is not None
    from gradscope.analysis.accuracy import bin_edges
    from gradscope.tasks import GROUP_NAMES

    edges = bin_edges(r.grid_correct.shape[-1], bins)
    table = Table(title=f"target accuracy on the frequency grid at iteration {r.iteration}, by target position",
                  title_justify="left")
    table.add_column("target/disturbant")
    for start, end in edges:
        table.add_column(f"t={start}–{end}", justify="right")
    table.add_column("n per bin", justify="right")
    for t in (0, 1):
        for d in (0, 1):
            correct, total = r.grid_bin_correct[t, d], r.grid_bin_total[t, d]
            table.add_row(f"{GROUP_NAMES[t]}/{GROUP_NAMES[d]}", *(f"{c / n:.3f}" if n else "nan"
                                                                  for c, n in zip(correct, total)),
                          str(int(total[0])))
    return table


def side_table(r: AccuracyResult) -> Table:
    """Token accuracy per decoding (a feedback model) and per old/new item (an extended vocabulary)."""
    from rich.table import Table

    table = Table(title=f"held-out token accuracy at iteration {r.iteration}", title_justify="left")
    for col in ("evaluated as", "token accuracy", "scored tokens"):
        table.add_column(col, justify="right")
    if r.decoded_time_correct is not None and r.decoded_time_scored is not None:
        names = {"autoregressive": "self-fed (autoregressive)", "teacher": "ground truth fed (teacher)"}
        for d, c, n in zip(r.decodings, r.decoded_time_correct, r.decoded_time_scored):
            table.add_row(names[d], f"{c.sum() / max(n.sum(), 1):.4f}", str(int(n.sum())))
    if r.item_time_correct is not None and r.item_time_scored is not None:
        for item, c, n in zip(("old items", "new items"), r.item_time_correct, r.item_time_scored):
            table.add_row(item + (f" ({r.decodings[0]})" if r.decodings else ""),
                          f"{c.sum() / n.sum():.4f}" if n.sum() else "nan", str(int(n.sum())))
    return table


# every option but -o, --overwrite and -q is generated: the evaluation's (AccuracyOptions) and the source's
# (SourceOptions), each --<field> with its help and default from the field
AccuracyCommand = generated_command(AccuracyOptions, "overwrite", SourceOptions)


@user_errors
def accuracy_command(
    ctx: typer.Context,
    checkpoints: Annotated[list[Path], typer.Argument(help="Checkpoint files and/or run directories (every checkpoint, oldest first); with --model hf --text, one model directory.", show_default=False)],
    out: Annotated[Optional[Path], Opt("--out", "-o", help="Zarr store to write (default: accuracy-<name>.zarr).")] = None,
    overwrite: Annotated[bool, Opt(help="Replace an existing store.")] = False,
    quiet: Annotated[bool, Opt("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Token, sequence and Damerau–Levenshtein accuracy on the held-out sets, and the frequency grid (docs/definitions.md §5);
    with --model hf --text FILE, perplexity and accuracy of a pretrained LM on raw text."""
    from gradscope.store.accuracy import family_values
    from gradscope.store.io import write_store
    from gradscope.store.records import AccuracyResult
    from gradscope.workflows.api import run_accuracy
    from gradscope.workflows.sources import source_of

    settings = ctx.meta.get(SETTINGS, {})  # every value checked in the dataclasses' __post_init__, first
    opts = build_options(AccuracyOptions, settings)
    source = source_of(checkpoints, build_options(SourceOptions, settings))
    out_path = out if out is not None else default_out("accuracy", checkpoints[0])
    check_out(out_path, overwrite)
    with make_progress(console) as progress:
        bar = progress.add_task("scoring" if source.kind == "text" else "evaluating", total=None, visible=not quiet)
        run = run_accuracy(source, opts, on_start=lambda n: progress.update(bar, total=n),
                           on_progress=lambda k: progress.advance(bar, k), command=command_line(ctx))
    ds = run.to_xarray()
    if source.kind == "text":
        console.print(escape(f"{run.text.path}: {len(run.text)} paragraphs, {run.text.tokens.size} tokens "
                             f"({'read from the cache' if run.text.from_cache else 'tokenised'}"
                             f"{f', cached in {run.text.cache}' if run.text.cache and not run.text.from_cache else ''}); "
                             f"frequency bins from the token counts of the {run.counts_source.replace('_', ' ')}"))
        console.print(text_table(ds))
    else:
        results = run.results
        last = results[-1]
        if isinstance(last, AccuracyResult):  # the token part (a family whose store is its own part alone has none)
            console.print(overview_table(results))
            if last.decodings or last.item_time_correct is not None:
                console.print(side_table(last))
            if last.grid_bin_correct is not None:
                console.print(grid_table(last, opts.bins_for(last.grid_correct.shape[-1])))
        family, values = family_values(ds)
        for line in family.lines(values) if family is not None and values else []:  # the task family's own
            console.print(escape(line), soft_wrap=True)
    write_store(ds, out_path, overwrite=overwrite)
    console.print(escape(f"wrote {out_path}"))


def text_table(ds: Any) -> Any:
    """Perplexity and accuracy of a pretrained LM on raw text, with their bootstrap intervals."""
    from rich.table import Table

    table = Table(title=f"{int(ds['pos_n'].sum())} scored tokens; 95% bootstrap CIs over paragraphs",
                  title_justify="left")
    for col in ("tokens", "n", "perplexity", "95% CI", "token accuracy", "95% CI "):
        table.add_column(col, justify="right" if col != "tokens" else "left")
    last = ds.isel(checkpoint=-1)

    def row(label: str, n: Any, ppl: str, acc: str, sel: dict[str, Any]) -> None:
        v = lambda name: float(last[name].sel(sel)) if sel else float(last[name])  # noqa: E731
        table.add_row(label, str(int(n)), f"{v(ppl):.2f}", escape(f"[{v(ppl + '_low'):.2f}, {v(ppl + '_high'):.2f}]"),
                      f"{v(acc):.4f}", escape(f"[{v(acc + '_low'):.4f}, {v(acc + '_high'):.4f}]"))

    row("all", ds["pos_n"].sum(), "perplexity", "token_accuracy", {})
    for b, n in zip(ds["freq_bin"].values, ds["freq_n"].values):
        row(str(b), n, "freq_perplexity", "freq_accuracy", {"freq_bin": b})
    for i, (a, e, n) in enumerate(zip(ds["pos_start"].values, ds["pos_end"].values, ds["pos_n"].values)):
        row(f"positions {a}–{e}", n, "pos_perplexity", "pos_accuracy", {"pos_bin": i})
    return table
