"""`gradscope dynamics`: parse → gradscope.workflows.dynamics → summary table + zarr store."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from gradscope.workflows.options import PART_OPTIONS, PROBE_OPTIONS, DynamicsOptions, unread_options  # torch-free: --help builds the options from it

from .common import (SETTINGS, check_out, check_text_source, command_line, default_out, given, make_console,
                     old_name, refuse_given, warn)
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


# the options of DynamicsOptions (each --<field>, its help and default from the field) are generated
DynamicsCommand = generated_command(DynamicsOptions, after="overwrite")


@user_errors
def dynamics_command(
    ctx: typer.Context,
    checkpoints: Annotated[list[Path], typer.Argument(help="Checkpoint files and/or run directories (every checkpoint of a run, oldest first).", show_default=False)],
    out: Annotated[Optional[Path], Opt("--out", "-o", help="Zarr store to write (default: dynamics-<name>.zarr).")] = None,
    overwrite: Annotated[bool, Opt(help="Replace an existing store.")] = False,
    target_freq: Annotated[Optional[list[str]], Opt("--target-freq", help="Probe target group(s), as in `gradscope stability`.")] = None,
    disturbant: Annotated[Optional[list[str]], Opt("--disturbant", help="Probe disturbant group(s), as in `gradscope stability`.")] = None,
    model_factory: Annotated[Optional[str], Opt("--model-factory", "--model", help="Your own model: FILE.py:FUNC or package.module:FUNC, where FUNC(checkpoint_path) returns gradscope.wrap(...) (runs your code: see the README's trust note); or hf[:CLASS]: a transformers model from a save_pretrained directory, or from a weights file with --config (docs/models-from-libraries.md).")] = None,
    config: Annotated[Optional[Path], Opt("--config", help="With --model-factory hf:CLASS and a weights file: the model's config.json.")] = None,
    length: Annotated[Optional[int], Opt(help="With --model-factory: probe sequence length (default 32); tokens uniform over the embedding's vocabulary.", show_default=False)] = None,
    token_counts: Annotated[Optional[Path], Opt("--token-counts", help="With --model-factory: counts per token id (.npy, or one per line): steps are classed frequent/rare by them.")] = None,
    text: Annotated[Optional[Path], Opt(help="With --model hf: probe sequences and Lyapunov trajectories of this raw UTF-8 text's paragraphs, tokenised with the model's own tokenizer; each step classed by its token's frequency in the text (docs/real-text.md). --length is then the row length, start token included (default 32).")] = None,
    counts_text: Annotated[Optional[Path], Opt(help="With --text: a (larger) text whose token counts define the frequency classes (default: --text).")] = None,
    tokenizer: Annotated[Optional[Path], Opt(help="With --text: the folder of the model's tokenizer (default: the model's directory).")] = None,
    corpus: Annotated[Optional[Path], Opt(help="lm checkpoints: the corpus directory, if it moved since training (its manifest must match the run's).")] = None,
    quiet: Annotated[bool, Opt("--quiet", "-q", help="No progress bar.")] = False,
    # --lyap-warmup's name before issue #39 (train's --warmup is the learning-rate warm-up), hidden; it warns
    warmup: Annotated[Optional[int], Opt("--warmup", hidden=True, help="Deprecated: the old name of --lyap-warmup; it will be removed.")] = None,
) -> None:
    """Gradient dynamics (docs/definitions.md §7): gradient flow, (t, T) grid, step spectra, gate terms, Lyapunov spectra.
    The sizes (--parts … --budget-seconds) are DynamicsOptions' fields."""
    import warnings

    from gradscope.errors import GradscopeError
    from gradscope.store.io import write_store
    from gradscope.workflows.dynamics import run_dynamics, run_factory_dynamics
    from gradscope.workflows.common import DivergedWarning

    settings = dict(ctx.meta.get(SETTINGS, {}))
    old_name(ctx, settings, warmup, "warmup", "lyap_warmup", "train's --warmup is the learning-rate warm-up")
    opts = build_options(DynamicsOptions, settings)  # checked in its __post_init__
    # an option of a part left out would be recorded and ignored (the rule is the workflow's, unread_options)
    typed = {n for names in (*PART_OPTIONS.values(), PROBE_OPTIONS) for n in names if given(ctx, n)}
    unread = unread_options(opts.parts, typed | ({"lyap_warmup"} if warmup is not None else set()), "--parts")
    if unread is not None:  # refuse_given names those typed: --warmup, the old name, as itself
        refuse_given(ctx, [*unread[0], *(["warmup"] if "lyap_warmup" in unread[0] else [])], unread[1])
    if model_factory is not None:
        refuse_given(ctx, ["target_freq", "disturbant", "corpus"], "a --model-factory model has no task groups or "
                     "corpus of its own (describe its tokens with --token-counts)")
    check_text_source(ctx, "dynamics", text, model_factory, config, ["token_counts"],
                      "with --text the steps are classed by the text's own counts (or --counts-text)")
    if model_factory is None and (length is not None or token_counts is not None):
        raise GradscopeError("--length/--token-counts: they describe probes for --model-factory models; "
                             "a gradscope checkpoint draws its probes from its task")
    out_path = out if out is not None else default_out("dynamics", checkpoints[0] if checkpoints else Path("x"))
    check_out(out_path, overwrite)
    with make_progress(console) as progress, warnings.catch_warnings():
        warnings.simplefilter("ignore", DivergedWarning)  # said below, in one line
        bar = progress.add_task("checkpoints", total=None, visible=not quiet)
        if text is not None:
            from gradscope.workflows.text_probes import DEFAULT_LENGTH, TextSource, run_text_dynamics

            if len(checkpoints) != 1:
                raise GradscopeError("checkpoint: with --text give exactly one model directory")
            source = TextSource(str(text), None if counts_text is None else str(counts_text),
                                None if tokenizer is None else str(tokenizer))
            run = run_text_dynamics(checkpoints[0], opts, source, length=length if length is not None else DEFAULT_LENGTH,
                                    model_factory=model_factory, config=config, command=command_line(ctx),
                                    on_plan=lambda plan: console.print(plan.describe()))
        elif model_factory is not None:
            if len(checkpoints) != 1:
                raise GradscopeError("checkpoint: with --model-factory give exactly one checkpoint file")
            run = run_factory_dynamics(model_factory, checkpoints[0], opts, length=length if length is not None else 32,
                                       token_counts=token_counts, command=command_line(ctx), config=config,
                                       on_plan=lambda plan: console.print(plan.describe()))
        else:
            run = run_dynamics(checkpoints, opts, corpus=corpus, target_freq=tuple(target_freq or ()),
                               disturbant=tuple(disturbant or ()),
                               on_start=lambda n: progress.update(bar, total=n),
                               on_progress=lambda k: progress.advance(bar, k), command=command_line(ctx),
                               on_plan=lambda plan: console.print(plan.describe()))
    ds = run.to_xarray()
    console.print(dynamics_table(ds))
    write_store(ds, out_path, overwrite=overwrite)
    bad = {k: v for k, v in run.nonfinite.items() if v}
    if bad:
        warn(f"non-finite (NaN or Inf) values, a diverged model? {', '.join(f'{v} in {k}' for k, v in bad.items())}; "
             f"stored as they are")
    console.print(f"wrote {out_path}")
