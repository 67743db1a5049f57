"""`gradscope stability`: parse → gradscope.workflows.stability → table + zarr store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from gradscope.analysis.bootstrap import Interval
from gradscope.errors import GradscopeError
from gradscope.store.io import write_store
from gradscope.store.stability import stability_dataset
from gradscope.train.device import resolve_device
from gradscope.workflows.stability import StabilityOptions, SummaryRow, run_stability, summarize

from .common import command_line, default_out, make_console
from .errors import user_errors
from .progress import make_progress

console = make_console()
Opt = typer.Option


def fmt(x: float) -> str:
    return "nan" if x != x else f"{x:.3f}"


def interval_text(iv: Interval) -> str:
    """'mean [low, high]' with three decimals; 'nan' where undefined."""
    return f"{fmt(iv.mean)} [{fmt(iv.low)}, {fmt(iv.high)}]"


def stability_table(rows: list[SummaryRow], kind: str, resamples: int) -> Table:
    """One row per checkpoint × condition; both pairs side by side."""
    table = Table(title=f"gradient stability, {kind} score: mean [95% CI] over triplets "
                        f"({resamples} bootstrap resamples)", title_justify="left")
    for col in ("iteration", "target/disturbant", "same-target", "same-suffix", "n", "NaN"):
        table.add_column(col, justify="left" if col.startswith("target") else "right", no_wrap=True)
    by_key: dict[tuple[str, int, str], dict[str, SummaryRow]] = {}
    for row in rows:
        by_key.setdefault((row.run, row.iteration, row.condition), {})[row.pair] = row
    for (_, iteration, condition), pairs in by_key.items():
        st, ss = pairs["same-target"].interval, pairs["same-suffix"].interval
        table.add_row(str(iteration), condition, interval_text(st), interval_text(ss), str(st.n), str(st.nan + ss.nan))
    return table


@user_errors
def stability_command(
    ctx: typer.Context,
    checkpoints: Annotated[list[Path], typer.Argument(help="Checkpoint files and/or run directories (every checkpoint of a run, oldest first).", show_default=False)],
    target_freq: Annotated[Optional[list[str]], Opt("--target-freq", help="Target token group: frequent, rare or all (repeatable). Default: frequent and rare for dual-frequency checkpoints, all otherwise.")] = None,
    disturbant: Annotated[Optional[list[str]], Opt("--disturbant", help="Disturbant (prefix and suffix) group: frequent, rare or all (repeatable).")] = None,
    target_pos: Annotated[int, Opt("--target-pos", help="Target position p (1-based) whose state z_p the Jacobian starts from.")] = 1,
    triplets: Annotated[int, Opt(help="Probe triplets per condition.")] = 64,
    score: Annotated[str, Opt(help="Score shown in the table: default, frobenius or l1 (all are stored).")] = "default",
    probes: Annotated[Optional[Path], Opt(help="Explicit probes: .npy int64 (n, 3, L), .npz with 'tokens' (+ 'target_group', 'disturbant_group'), or a previous stability store.")] = None,
    out: Annotated[Optional[Path], Opt("--out", "-o", help="Zarr store to write (default: stability-<name>.zarr).")] = None,
    overwrite: Annotated[bool, Opt(help="Replace an existing store.")] = False,
    device: Annotated[str, Opt(help="auto (cuda when present), cpu, cuda or cuda:N.")] = "auto",
    batch_size: Annotated[int, Opt(help="Triplets per Jacobian batch (bounds memory).")] = 32,
    seed: Annotated[int, Opt(help="Seed for the probes and the bootstrap.")] = 0,
    method: Annotated[str, Opt(help="Jacobian engine: auto, analytic, vjp or func.")] = "auto",
    sv: Annotated[int, Opt(help="Singular values kept per Jacobian.")] = 64,
    resamples: Annotated[int, Opt(help="Bootstrap resamples for the CIs.")] = 10_000,
    quiet: Annotated[bool, Opt("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Gradient stability of checkpoints: J = ∂h_2L/∂z_p on probe triplets, scored pairwise (SPEC §4)."""
    for name, value in (("--triplets", triplets), ("--batch-size", batch_size), ("--sv", sv),
                        ("--resamples", resamples)):
        if value < 1:
            raise GradscopeError(f"{name}: got {value}; it must be positive")
    opts = StabilityOptions(tuple(target_freq or ()), tuple(disturbant or ()), target_pos, triplets, probes, seed,
                            method, batch_size, sv, device)
    out_path = out if out is not None else default_out("stability", checkpoints[0] if checkpoints else Path("x"))
    if out is not None and out.exists() and not overwrite:
        raise GradscopeError(f"--out: {out} already exists; choose another path or pass --overwrite")
    with make_progress(console) as progress:
        bar = progress.add_task("jacobians", total=None, visible=not quiet)
        loaded, probe_set, results = run_stability(
            checkpoints, opts, on_start=lambda total: progress.update(bar, total=total),
            on_progress=lambda k: progress.advance(bar, k))
    rows = summarize(results, probe_set, score, seed, resamples)
    console.print(stability_table(rows, score, resamples))
    ds = stability_dataset(results, probe_set, opts, loaded[0].config, command_line(ctx),
                           str(resolve_device(device)))
    write_store(ds, out_path, overwrite=overwrite)
    nan = sum(int(r.result.scores[score].isnan().sum()) for r in results)
    if nan:
        console.print(f"[yellow]{nan} NaN scores (an all-zero Jacobian) were left out of the means.[/]")
    console.print(f"wrote {out_path}")
