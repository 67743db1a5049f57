"""`gradscope accuracy`: parse → gradscope.workflows.accuracy → tables + zarr store."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.markup import escape  # paths are text, never markup

from gradscope.errors import GradscopeError

from .common import check_out, command_line, default_out, given, make_console
from .errors import user_errors
from .progress import make_progress

if TYPE_CHECKING:
    from rich.table import Table
    from gradscope.store.records import AccuracyResult, CosineResult

console = make_console()
Opt = typer.Option


def parse_bins(text: str) -> int | tuple[int, ...]:
    """'4' → 4 equal bins; '0,8,64' → explicit 0-based edges."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise GradscopeError(f"--bins: got {text!r}; give a number of bins (4) or edges (0,16,32,64)") from None
    if len(values) == 1:
        if values[0] < 1:
            raise GradscopeError(f"--bins: got {values[0]}; need at least 1 bin")
        return values[0]
    if values != sorted(set(values)) or values[0] != 0:
        raise GradscopeError(f"--bins: got {text!r}; edges must start at 0 and increase")
    return tuple(values)


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


def cosine_table(r: CosineResult) -> Table:
    """Mean cosine similarity per output position with its bootstrap interval (vector tasks)."""
    from rich.table import Table

    table = Table(title=f"held-out cosine similarity at iteration {r.iteration} (mean over all scored positions "
                        f"{r.cosine_similarity:.4f}; 95% bootstrap CI over {r.cosine.shape[0]} sequences)",
                  title_justify="left")
    for col in ("time", "mean cosine", "95% CI"):
        table.add_column(col, justify="right")
    for t, m, lo, hi in zip(r.times, r.position_mean, r.position_low, r.position_high):
        table.add_row(str(int(t) + 1), f"{m:.4f}", f"[{lo:.4f}, {hi:.4f}]")
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


@user_errors
def lm_table(result: Any) -> Any:
    """Test perplexity and token accuracy of an lm checkpoint: overall, by frequency and position bin."""
    from rich.table import Table

    from gradscope.analysis.lm import FREQ_LABELS, perplexity

    lm = result.lm
    table = Table(title=f"test split ({lm.n} tokens) after {result.iteration} iterations", title_justify="left")
    for col in ("tokens", "n", "perplexity", "token accuracy"):
        table.add_column(col, justify="right" if col != "tokens" else "left")
    rows = [("all", lm.n, lm.perplexity, lm.accuracy)]
    rows += [(label, n, perplexity(nll, n), c / n if n else float("nan"))
             for label, nll, n, c in zip(FREQ_LABELS, lm.freq_nll, lm.freq_n, lm.freq_correct)]
    rows += [(f"positions {a}–{b}", n, perplexity(nll, n), c / n if n else float("nan"))
             for (a, b), nll, n, c in zip(lm.edges, lm.pos_nll, lm.pos_n, lm.pos_correct)]
    for label, n, ppl, acc in rows:
        table.add_row(label, str(int(n)), f"{ppl:.2f}", f"{acc:.4f}")
    return table


@user_errors
def accuracy_command(
    ctx: typer.Context,
    checkpoints: Annotated[list[Path], typer.Argument(help="Checkpoint files and/or run directories (every checkpoint, oldest first).", show_default=False)],
    out: Annotated[Optional[Path], Opt("--out", "-o", help="Zarr store to write (default: accuracy-<name>.zarr).")] = None,
    overwrite: Annotated[bool, Opt(help="Replace an existing store.")] = False,
    bins: Annotated[str, Opt(help="Target-position bins of the grid: a count (4 = quarters) or 0-based edges (0,8,64).")] = "4",
    grid: Annotated[Optional[bool], Opt("--grid/--no-grid", help="Require (or skip) the frequency grid. Default: evaluate it when the checkpoint has one.")] = None,
    device: Annotated[str, Opt(help="auto (cuda when present), cpu, cuda or cuda:N.")] = "auto",
    batch_size: Annotated[int, Opt(help="Sequences per forward pass.")] = 1024,
    decoding: Annotated[str, Opt(help="Feedback models (trained with --decoding): both (self-fed and ground-truth fed, side by side), autoregressive or teacher.")] = "both",
    resamples: Annotated[int, Opt(help="reverse-continuous: bootstrap resamples of the per-position cosine-similarity CIs.")] = 10_000,
    seed: Annotated[int, Opt(help="reverse-continuous: seed of the bootstrap resamples.")] = 0,
    corpus: Annotated[Optional[Path], Opt(help="lm checkpoints: the corpus directory, if it moved since training (its manifest must match the run's).")] = None,
    quiet: Annotated[bool, Opt("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Token, sequence and Damerau–Levenshtein accuracy on the held-out sets, and the frequency grid (SPEC §5)."""
    from gradscope.store.io import write_store
    from gradscope.store.records import AccuracyResult, CosineResult
    from gradscope.workflows.accuracy import AccuracyOptions, run_accuracy

    if batch_size < 1:
        raise GradscopeError(f"--batch-size: got {batch_size}; it must be positive")
    opts = AccuracyOptions(parse_bins(bins), grid, device, batch_size, decoding,
                           resamples if given(ctx, "resamples") else None, seed if given(ctx, "seed") else None,
                           None if corpus is None else str(corpus))
    out_path = out if out is not None else default_out("accuracy", checkpoints[0])
    check_out(out_path, overwrite)
    with make_progress(console) as progress:
        bar = progress.add_task("evaluating", total=None, visible=not quiet)
        run = run_accuracy(checkpoints, opts, on_start=lambda n: progress.update(bar, total=n),
                           on_progress=lambda k: progress.advance(bar, k), command=command_line(ctx))
    results = run.results
    if isinstance(results[0], CosineResult):
        console.print(cosine_table(results[-1]))  # type: ignore[arg-type]
        write_store(run.to_xarray(), out_path, overwrite=overwrite)
        console.print(escape(f"wrote {out_path}"))
        return
    console.print(overview_table(results))  # type: ignore[arg-type]
    last = results[-1]
    assert isinstance(last, AccuracyResult)
    if last.decodings or last.item_time_correct is not None:
        console.print(side_table(last))
    if last.grid_bin_correct is not None:
        console.print(grid_table(last, opts.bins))
    if last.lm is not None:
        console.print(lm_table(last))
    if last.length_total is not None:
        lengths = [(n, c / t) for n, (c, t) in enumerate(zip(last.length_correct, last.length_total)) if t]
        console.print("token accuracy by sequence length: " + ", ".join(f"L={n}: {a:.3f}" for n, a in lengths))
    write_store(run.to_xarray(), out_path, overwrite=overwrite)
    console.print(escape(f"wrote {out_path}"))
