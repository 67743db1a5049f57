"""`gradscope train`: parse options → build configs → call gradscope.train.train → print results."""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from typer.core import TyperCommand

from gradscope.errors import GradscopeError

from .common import command_line, make_console
from .errors import user_errors
from .progress import make_progress

if TYPE_CHECKING:
    from gradscope.config import RunConfig

console = make_console()

def default_run_dir(cfg: RunConfig, preset: str) -> Path:
    """runs/<preset>-<core>-<pe>-K<K>-s<seed>, numbered -2, -3… if it already exists."""
    stem = f"{preset}-{cfg.model.core}-{cfg.model.pe}-K{cfg.task.vocab_size}-s{cfg.train.seed}"
    path, n = Path("runs") / stem, 1
    while path.exists():
        n += 1
        path = Path("runs") / f"{stem}-{n}"
    return path


def print_result(result: dict[str, Any], run_dir: Path) -> None:
    from rich.table import Table

    table = Table(title=f"held-out evaluation after {result['iteration']} iterations", title_justify="left")
    table.add_column("set")
    table.add_column("token accuracy", justify="right")
    table.add_column("sequence accuracy", justify="right")
    u = result.get("uniform", {})
    if "cosine_similarity" in u:
        console.print(f"held-out mean cosine similarity after {result['iteration']} iterations (n={u['n']}): "
                      f"{u['cosine_similarity']:.4f}\nrun directory: {run_dir}")
        return
    for key, label in (("uniform", "uniform"), ("uniform_teacher", "uniform, ground truth fed")):
        if key in result:
            u = result[key]
            name = f"{label} (n={u['n']})" if "uniform_teacher" not in result or key != "uniform" else \
                f"uniform, self-fed (n={u['n']})"
            table.add_row(name, f"{u['token_accuracy']:.4f}", f"{u['sequence_accuracy']:.4f}")
    for item, acc in result.get("items", {}).items():
        table.add_row(f"uniform, {item} items", f"{acc:.4f}", "")
    for cell, acc in result.get("grid", {}).items():
        table.add_row(f"grid {cell} (target/disturbant)", f"{acc:.4f}", "")
    console.print(table)
    console.print(f"run directory: {run_dir}")


Opt = typer.Option


def _int(text: str) -> Any:
    """A count option: an integer, also written like 1e9. Text that is no number is passed on as
    it is, for the configuration check to refuse in one line (naming the option)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if math.isfinite(value) and value == int(value) else text


def _float(text: str) -> Any:
    """A real option; text that is no number is passed on, as for :func:`_int`."""
    try:
        return float(text)
    except ValueError:
        return text


CORE_OPTIONS = "gradscope.core_options"  # where TrainCommand leaves the core options' values in ctx.meta


def core_option_params() -> list[Any]:
    """One click option per registered core setting (:func:`gradscope.models.registry.core_options`),
    made by typer from a signature built here, as it makes the hand-written options."""
    from gradscope.models.registry import core_options

    params = []
    for o in core_options().values():
        parser, metavar = {int: (_int, "<int>"), float: (_float, "<float>")}.get(o.kind, (None, None))
        span = "" if o.low is None and o.high is None else \
            f"; {'' if o.low is None else f'>= {o.low}'}{', ' if None not in (o.low, o.high) else ''}{'' if o.high is None else f'<= {o.high}'}"
        extra = {"parser": parser, "metavar": metavar} if parser is not None else {}
        flag = "--" + o.name.replace("_", "-")
        annotation = Annotated[Optional[o.kind], Opt(flag, help=f"{o.help} ({', '.join(o.cores)}{span})", **extra)]
        params.append(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation))

    def settings(**_: Any) -> None:
        """The cores' own settings."""

    settings.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    holder = typer.Typer(add_completion=False)
    holder.command()(settings)
    return list(typer.main.get_command(holder).params)


class TrainCommand(TyperCommand):
    """`gradscope train` with one option per registered core setting, added when this command is
    parsed or its help shown (other commands never import the models for it)."""

    def get_params(self, ctx: typer.Context) -> list[Any]:
        params = super().get_params(ctx)
        own = {p.name for p in params}
        extra = [p for p in core_option_params() if p.name not in own]
        return params[:-1] + extra + params[-1:]  # --help stays last

    def invoke(self, ctx: typer.Context) -> Any:
        names = {p.name for p in core_option_params()}
        ctx.meta[CORE_OPTIONS] = {k: ctx.params.pop(k) for k in list(ctx.params) if k in names}
        return super().invoke(ctx)


def extension_run_config(parent: Path, options: dict[str, Any], new_item_share: float | None) -> RunConfig:
    """The config of `gradscope train --extend-from PARENT --vocab K'`: the parent's model (no model
    option may be given), its task with task options given applied, and its training settings
    with the training options given applied."""
    from gradscope.presets import FIELDS
    from gradscope.train.extend import extension_config

    given = {k: v for k, v in options.items() if v is not None}
    fixed = sorted(k for k in given if FIELDS.get(k, ("core", ""))[0] in ("model", "core"))
    if fixed:
        raise GradscopeError(f"--extend-from: the extended model keeps its parent's architecture; remove "
                             f"{', '.join('--' + k.replace('_', '-') for k in fixed)}")
    if "vocab" not in given:
        raise GradscopeError("--vocab: give the extended vocabulary size K' (larger than the checkpoint's)")
    task = {FIELDS[k][1]: v for k, v in given.items() if k in FIELDS and FIELDS[k][0] == "task" and k != "vocab"}
    train = {FIELDS[k][1]: v for k, v in given.items() if k in FIELDS and FIELDS[k][0] == "train"}
    if "beta1" in given or "beta2" in given:
        raise GradscopeError("--beta1/--beta2: an extension keeps its parent's Adam betas")
    return extension_config(parent, given["vocab"], new_item_share=new_item_share, train=train, task=task)


@user_errors
def train_command(
    ctx: typer.Context,
    out: Annotated[Optional[Path], Opt("--out", "-o", help="Run directory to create (default: runs/<preset>-<core>-<pe>-K<K>-s<seed>).")] = None,
    resume: Annotated[Optional[Path], Opt(help="Continue the run in this directory exactly where its last checkpoint left off.")] = None,
    preset: Annotated[str, Opt(help="Starting configuration: tiny (≈1 min on 2 CPU cores) or paper (SPEC §3, for a GPU).")] = "tiny",
    model: Annotated[Optional[str], Opt(help="Core: a name in gradscope's core registry (an unknown name lists them all). A core's own settings are the last options listed.")] = None,
    pe: Annotated[Optional[str], Opt(help="Positional encoding: a kind in gradscope's PE registry (none, sinusoidal, learnable, random and dummy are built in; an unknown name lists them all).")] = None,
    pe_combine: Annotated[Optional[str], Opt(help="How PE meets the embedding: concat or add.")] = None,
    layers: Annotated[Optional[int], Opt(help="Number of layers (RNN) or S4D blocks.", parser=_int, metavar="<int>")] = None,
    embed: Annotated[Optional[int], Opt(help="Embedding size E.", parser=_int, metavar="<int>")] = None,
    hidden: Annotated[Optional[int], Opt(help="Hidden size H.", parser=_int, metavar="<int>")] = None,
    max_len: Annotated[Optional[int], Opt(help="Positions covered by a learnable/random PE (default: the task's length).", parser=_int, metavar="<int>")] = None,
    task: Annotated[Optional[str], Opt(help="Task: a name in gradscope's task registry (reverse, reverse-variable, sort, delayed-sum, predecessor and copy are built in; an unknown name lists them all).")] = None,
    vocab: Annotated[Optional[int], Opt(help="Vocabulary size K (copy: data tokens; blank and delimiter are added).", parser=_int, metavar="<int>")] = None,
    length: Annotated[Optional[int], Opt(help="Sequence length L (reverse-variable: the maximum).", parser=_int, metavar="<int>")] = None,
    max_length: Annotated[Optional[int], Opt(help="lm: the first N tokens of each paragraph (the same as --length; default 1024, as the paper).", parser=_int, metavar="<int>")] = None,
    corpus: Annotated[Optional[str], Opt(help="lm: the corpus directory made by `gradscope corpus prepare` (its vocabulary sets K).")] = None,
    min_length: Annotated[Optional[int], Opt(help="reverse-variable: the minimum L.", parser=_int, metavar="<int>")] = None,
    distribution: Annotated[Optional[str], Opt(help="Token distribution: uniform or dual (Frequent/Rare halves).")] = None,
    rarity: Annotated[Optional[float], Opt(help="dual: probability that a position holds a Rare token.", parser=_float, metavar="<float>")] = None,
    heldout: Annotated[Optional[int], Opt(help="Size of the uniform held-out test set.", parser=_int, metavar="<int>")] = None,
    grid_per_cell: Annotated[Optional[int], Opt(help="dual reverse: held-out sequences per (target, disturbant, position).", parser=_int, metavar="<int>")] = None,
    hold_min: Annotated[Optional[int], Opt(help="copy: fewest blanks in the hold phase.", parser=_int, metavar="<int>")] = None,
    hold_max: Annotated[Optional[int], Opt(help="copy: most blanks in the hold phase.", parser=_int, metavar="<int>")] = None,
    dim: Annotated[Optional[int], Opt(help="reverse-continuous: tokens are points of the unit sphere S^(dim−1).", parser=_int, metavar="<int>")] = None,
    decoding: Annotated[Optional[str], Opt(help="Output-phase input: none (query tokens), or a feedback model fed the previous token: teacher (ground truth, as the paper trained) or autoregressive (its own prediction).")] = None,
    extend_from: Annotated[Optional[Path], Opt(help="Vocabulary extension (paper §4.2): a checkpoint or run directory to extend to --vocab items; only the new rows train, everything pretrained is frozen.")] = None,
    new_item_share: Annotated[Optional[float], Opt(help="--extend-from: probability that a position holds a new item (default: uniform over all items, as the paper did).", parser=_float, metavar="<float>")] = None,
    iterations: Annotated[Optional[int], Opt(help="Training iterations.", parser=_int, metavar="<int>")] = None,
    batch_size: Annotated[Optional[int], Opt(help="Sequences per batch.", parser=_int, metavar="<int>")] = None,
    lr: Annotated[Optional[float], Opt(help="Peak learning rate (linear warm-up, then cosine to 0).", parser=_float, metavar="<float>")] = None,
    warmup: Annotated[Optional[int], Opt(help="Warm-up iterations.", parser=_int, metavar="<int>")] = None,
    beta1: Annotated[Optional[float], Opt(help="Adam β1.", parser=_float, metavar="<float>")] = None,
    beta2: Annotated[Optional[float], Opt(help="Adam β2 (paper 0.999; its reference code 0.98).", parser=_float, metavar="<float>")] = None,
    eps: Annotated[Optional[float], Opt(help="Adam ε (reference code: 1e-9).", parser=_float, metavar="<float>")] = None,
    clip: Annotated[Optional[float], Opt(help="Gradient-norm clip (0 disables).", parser=_float, metavar="<float>")] = None,
    checkpoint_every: Annotated[Optional[int], Opt(help="Write a checkpoint every N iterations.", parser=_int, metavar="<int>")] = None,
    log_every: Annotated[Optional[int], Opt(help="Log metrics every N iterations.", parser=_int, metavar="<int>")] = None,
    seed: Annotated[Optional[int], Opt(help="Seed for initialisation, held-out data and batches.", parser=_int, metavar="<int>")] = None,
    device: Annotated[Optional[str], Opt(help="auto (cuda when present), cpu, cuda or cuda:N.")] = None,
    threads: Annotated[Optional[int], Opt(help="torch CPU threads (0 = torch's default).", parser=_int, metavar="<int>")] = None,
    stop_after: Annotated[Optional[int], Opt(help="Stop after this many iterations in this invocation (checkpointed; continue with --resume).", parser=_int, metavar="<int>")] = None,
    quiet: Annotated[bool, Opt("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Train a model on a synthetic task, writing a run directory with checkpoints."""
    from gradscope.guard import as_int
    from gradscope.presets import build_config, FIELDS, PRESETS
    from gradscope.train.loop import is_run_dir, read_run_config, train

    options = {k: v for k, v in locals().items() if k in FIELDS or k in ("beta1", "beta2")}
    if max_length is not None:
        if length is not None and length != max_length:
            raise GradscopeError(f"--max-length: got {max_length} and --length {length}; they name the same setting")
        options["length"] = max_length
    options.update(ctx.meta.get(CORE_OPTIONS, {}))
    if resume is not None:
        given = sorted(k for k, v in {**options, "extend_from": extend_from, "new_item_share": new_item_share}.items()
                       if v is not None)
        if given or out is not None:
            raise GradscopeError(f"--resume: a resumed run keeps its own configuration; remove "
                                 f"{', '.join('--' + g.replace('_', '-') for g in given) or '--out'}")
        if not is_run_dir(resume):
            raise GradscopeError(f"--resume: {resume} is not a gradscope run directory (no config.json)")
        cfg, run_dir = read_run_config(resume), resume
    elif extend_from is not None:
        cfg = extension_run_config(extend_from, options, new_item_share)
        run_dir = out if out is not None else default_run_dir(cfg, "extend")
    else:
        if new_item_share is not None:
            raise GradscopeError("--new-item-share: only an extension (--extend-from) has new items")
        if preset not in PRESETS:
            raise GradscopeError(f"--preset: got {preset!r}; valid presets are {', '.join(PRESETS)}")
        cfg = build_config(preset, options)
        run_dir = out if out is not None else default_run_dir(cfg, preset)
    if stop_after is not None:
        as_int(stop_after, "--stop-after", low=1)
    command = command_line(ctx)
    with make_progress(console, "loss", "acc") as progress:
        bar = progress.add_task("training", total=cfg.train.iterations, loss="-", acc="-", visible=not quiet)

        def on_step(iteration: int, log: dict[str, float] | None) -> None:
            if log is None:
                progress.update(bar, completed=iteration)
            else:
                progress.update(bar, completed=iteration, loss=f"{log['loss']:.3f}", acc=f"{log['accuracy']:.3f}")

        result = train(cfg, run_dir, resume=resume is not None, stop_after=stop_after, on_step=on_step, command=command,
                       extend_from=extend_from if resume is None else None)
    if result:
        print_result(result, run_dir)
    else:
        console.print(f"stopped early; continue with: gradscope train --resume {run_dir}")
