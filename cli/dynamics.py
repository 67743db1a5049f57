"""`gradscope dynamics`: parse → gradscope.workflows.dynamics → summary table + zarr store."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from gradscope.workflows.options import DynamicsOptions, SourceOptions, set_options, unread_options  # torch-free (--help)

from .common import SETTINGS, check_out, command_line, default_out, make_console, refuse_given, warn
from .errors import user_errors
from .generated import build_options, generated_command
from .progress import make_progress

if TYPE_CHECKING:
    import xarray as xr

console = make_console()
Opt = typer.Option


def dynamics_table(ds: "xr.Dataset"):  # noqa: ANN201 - a rich Table
    """Per checkpoint: median gradient-flow decay, mean step radius, top Lyapunov exponent, and the
    largest gate term, after frequent and after rare tokens."""
    import numpy as np
    from rich.table import Table

    table = Table(title="gradient dynamics per checkpoint (medians over probe sequences; docs/definitions.md §7)",
                  title_justify="left")
    cls = ds["token_class"].values
    # the steps' classes: frequent and rare, or (a vector task's points, a model without counts) the one there is
    present = [str(k) for k in dict.fromkeys(np.asarray(cls).ravel()) if k not in ("query", "start")]
    kinds = ("frequent", "rare") if {"frequent", "rare"} & set(present) or not present else tuple(present[:2])
    shown = "freq / rare" if kinds == ("frequent", "rare") else " / ".join(kinds)
    # a core without a readout from the state (library models) has no ∂y_T/∂z_T: the ratio's end is z_{T−1}
    last = -1
    flow = ds["flow_fro"].values if "flow_fro" in ds else None
    if flow is not None and flow.shape[-1] > 1 and not np.isfinite(flow[..., -1]).any() \
            and np.isfinite(flow[..., -2]).any():
        last = -2
    ratio = "|dy_T/dz_1| / |dy_T/dz_T|" if last == -1 else "|dy_T/dz_1| / |dy_T/dz_T−1|"
    for col in ("iteration", ratio, f"step radius ({shown})", "λ_1 [min, max]",
                "SE of λ_1 (traj / batch)", "Σλ", "−∞ · below res. · unconv.", f"largest gate term ({shown})"):
        table.add_column(col, justify="right")
    for c in range(ds.sizes["checkpoint"]):
        it = int(ds["iteration"][c])
        row = [str(it) if it >= 0 else "–"]  # an in-memory or factory model has no iteration
        if "flow_fro" in ds:
            f = ds["flow_fro"].values[c]
            with np.errstate(divide="ignore", invalid="ignore"):  # a diverged model's 0/0 is shown as nan
                row.append(f"{np.median(f[:, 0] / f[:, last]):.2e}")
        else:
            row.append("-")
        if "step_radius" in ds:
            r = ds["step_radius"].values[c]
            row.append(" / ".join(f"{np.median(r[cls == k]):.3f}" if (cls == k).any() else "-" for k in kinds))
        else:
            row.append("-")
        if "lyapunov" in ds:
            row += lyapunov_cells(ds, c)
        else:
            row += ["-", "-", "-", "-"]
        if "gate_norm" in ds:
            g = ds["gate_norm"].values[c]  # (n, T, G)
            gates = [str(x) for x in ds["gate"].values]
            picks = []
            for k in kinds:
                mask = cls == k
                med = np.median(g[mask], axis=0) if mask.any() else None  # (G,)
                picks.append("-" if med is None else "nan" if np.isnan(med).any() else gates[int(np.argmax(med))])
            row.append(" / ".join(picks))
        else:
            row.append("-")
        table.add_row(*row)
    if ds.attrs.get("held"):  # a hybrid or transformer (docs/models-from-libraries.md)
        table.caption = (f"step radius, gates and λ: the recurrent layers' states, the attention caches "
                         f"({ds.attrs['held']}) held as inputs along the trajectory; the flow: the whole state")
        table.caption_justify = "left"
    return table


def lyapunov_cells(ds: "xr.Dataset", c: int) -> list[str]:
    """λ_1 over trajectories, its standard errors (over trajectories · batch means, combined over
    trajectories; "-" in a store without error bars), Σλ and the count of −∞ / below-resolution /
    unconverged exponents (the most of any trajectory) of checkpoint c. Only resolved exponents are
    averaged; Σλ is −inf when an exponent is, and an upper bound (≤) when some are below resolution;
    NaN and +inf (a diverged model) are shown as such, never as a bound."""
    import numpy as np

    from gradscope.store.dynamics import batch_se_of_mean, resolved_exponents

    lam = ds["lyapunov"].values[c]  # (m, k)
    resolved = resolved_exponents(ds, c)  # NaN where −inf or below resolution
    low = np.isfinite(lam) & np.isnan(resolved)  # the flagged upper bounds
    top = resolved[:, 0][np.isfinite(resolved[:, 0])]
    odd = np.isnan(lam[:, 0]) | np.isposinf(lam[:, 0])  # a diverged model's: NaN or +inf, never "below resolution"
    word = "nan" if np.isnan(lam[:, 0]).any() else "+inf"
    first = word if odd.all() else f"{top.mean():+.4f} [{top.min():+.4f}, {top.max():+.4f}]" if top.size else "−inf" \
        if np.isneginf(lam[:, 0][~odd]).all() else "below res."
    if odd.any() and not odd.all():
        first += f" ({word} in {int(odd.sum())}/{len(odd)})"
    total = lam.sum(-1)
    if np.isnan(total).any():
        sums = "nan" if np.isnan(total).all() else f"nan in {int(np.isnan(total).sum())}/{len(total)}"
    elif np.isneginf(total).any():
        sums = "−inf" if np.isneginf(total).all() else f"−inf in {int(np.isneginf(total).sum())}/{len(total)}"
    else:
        sums = ("≤ " if low.any() else "") + f"{total.mean():+.3f}"
    D = lam.shape[-1]
    errors = "-"
    batch = batch_se_of_mean(ds, c)
    if batch is not None:
        traj = ds["lyapunov_se_trajectories"].values[c][0] if "lyapunov_se_trajectories" in ds else np.nan
        fmt = lambda v: f"{v:.2g}" if np.isfinite(v) else "–"  # noqa: E731
        errors = f"{fmt(traj)} / {fmt(batch[0])}"
    unconv = f" · {int(ds['lyapunov_unconverged'].values[c].sum(-1).max())}" if "lyapunov_unconverged" in ds else ""
    return [first, errors, sums, f"{int(np.isneginf(lam).sum(-1).max())} · {int(low.sum(-1).max())}{unconv} of {D}"]


# every option but -o, --overwrite and -q is generated: the sizes and the probes' source (DynamicsOptions) and the
# model's source (SourceOptions), each --<field> with its help and default from the field
DynamicsCommand = generated_command(DynamicsOptions, "overwrite", SourceOptions)


@user_errors
def dynamics_command(
    ctx: typer.Context,
    checkpoints: Annotated[list[Path], typer.Argument(help="Checkpoint files and/or run directories (every checkpoint of a run, oldest first); with --model-factory or --text, one file or directory.", show_default=False)],
    out: Annotated[Optional[Path], Opt("--out", "-o", help="Zarr store to write (default: dynamics-<name>.zarr).")] = None,
    overwrite: Annotated[bool, Opt(help="Replace an existing store.")] = False,
    quiet: Annotated[bool, Opt("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Gradient dynamics (docs/definitions.md §7): gradient flow, (t, T) grid, step spectra, gate terms, Lyapunov spectra.
    The options are the fields of DynamicsOptions and SourceOptions."""
    import warnings

    from gradscope.store.io import write_store
    from gradscope.workflows.api import run_dynamics
    from gradscope.workflows.common import DivergedWarning
    from gradscope.workflows.sources import source_of

    settings = ctx.meta.get(SETTINGS, {})  # every value checked in the dataclasses' __post_init__, first
    opts = build_options(DynamicsOptions, settings)
    unread = unread_options(opts.parts, set_options(opts), "--parts")  # an option of a part left out: refused
    if unread is not None:
        refuse_given(ctx, unread[0], unread[1])
    source = source_of(checkpoints, build_options(SourceOptions, settings))
    out_path = out if out is not None else default_out("dynamics", checkpoints[0] if checkpoints else Path("x"))
    check_out(out_path, overwrite)
    with make_progress(console) as progress, warnings.catch_warnings():
        warnings.simplefilter("ignore", DivergedWarning)  # said below, in one line
        bar = progress.add_task("checkpoints", total=None, visible=not quiet)
        run = run_dynamics(source, opts, command=command_line(ctx), on_start=lambda n: progress.update(bar, total=n),
                           on_progress=lambda k: progress.advance(bar, k),
                           on_plan=lambda plan: console.print(plan.describe()))
    ds = run.to_xarray()
    console.print(dynamics_table(ds))
    write_store(ds, out_path, overwrite=overwrite)
    bad = {k: v for k, v in run.nonfinite.items() if v}
    if bad:
        warn(f"non-finite (NaN or Inf) values, a diverged model? {', '.join(f'{v} in {k}' for k, v in bad.items())}; "
             f"stored as they are")
    console.print(f"wrote {out_path}")
