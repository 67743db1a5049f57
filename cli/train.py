"""`gradscope train`: parse options → build configs → call gradscope.train.train → print results."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from gradscope.errors import GradscopeError

from .common import SETTINGS, command_line, make_console, warn
from .errors import user_errors
from .generated import _float, _int, settings_command
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
    if u and "token_accuracy" not in u:  # a family of vector positions: the scores it declares (Task.heldout_scores)
        scores = ", ".join(f"{name.replace('_', ' ')} {value:.4f}" for name, value in u.items() if name != "n")
        console.print(f"held-out evaluation after {result['iteration']} iterations (n={u['n']}): {scores}\n"
                      f"run directory: {run_dir}")
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


# one option per setting of a run (gradscope.presets.settings: the config sections' fields and every registered
# core's own options), generated after --preset by the one flag generator, cli/generated.py
TrainCommand = settings_command("preset")


def extension_run_config(parent: Path, options: dict[str, Any], new_item_share: float | None) -> RunConfig:
    """The config of `gradscope train --extend-from PARENT --vocab-size K'`: the parent's model (no
    model option may be given), its task with task options given applied, and its training settings
    with the training options given applied."""
    from gradscope.presets import settings
    from gradscope.train.extend import extension_config

    known = settings()
    given = {k: v for k, v in options.items() if v is not None}
    fixed = sorted(k for k in given if k in known and known[k].section in ("model", "core"))
    if fixed:
        raise GradscopeError(f"--extend-from: the extended model keeps its parent's architecture; remove "
                             f"{', '.join('--' + k.replace('_', '-') for k in fixed)}")
    if "vocab_size" not in given:
        raise GradscopeError("--vocab-size: give the extended vocabulary size K' (larger than the checkpoint's)")
    task = {known[k].field: v for k, v in given.items()
            if k in known and known[k].section == "task" and k != "vocab_size"}
    train = {known[k].field: v for k, v in given.items() if k in known and known[k].section == "train"}
    if "beta1" in given or "beta2" in given:
        raise GradscopeError("--beta1/--beta2: an extension keeps its parent's Adam betas")
    return extension_config(parent, given["vocab_size"], new_item_share=new_item_share, train=train, task=task)


@user_errors
def train_command(
    ctx: typer.Context,
    out: Annotated[Optional[Path], Opt("--out", "-o", help="Run directory to create (default: runs/<preset>-<core>-<pe>-K<K>-s<seed>).")] = None,
    resume: Annotated[Optional[Path], Opt(help="Continue the run in this directory exactly where its last checkpoint left off.")] = None,
    preset: Annotated[str, Opt(help="Starting configuration: tiny (≈1 min on 2 CPU cores) or paper (docs/definitions.md §3, for a GPU). The settings that follow override it; each is named as its config field.")] = "tiny",
    beta1: Annotated[Optional[float], Opt(help="Adam β1.", parser=_float, metavar="<float>")] = None,
    beta2: Annotated[Optional[float], Opt(help="Adam β2 (paper 0.999; its reference code 0.98).", parser=_float, metavar="<float>")] = None,
    max_length: Annotated[Optional[int], Opt(help="A corpus task: the first N tokens of each paragraph (the same as --length; default 1024, as the paper).", parser=_int, metavar="<int>")] = None,
    extend_from: Annotated[Optional[Path], Opt(help="Vocabulary extension (paper §4.2): a checkpoint or run directory to extend to --vocab-size items; only the new rows train, everything pretrained is frozen.")] = None,
    new_item_share: Annotated[Optional[float], Opt(help="--extend-from: probability that a position holds a new item (default: uniform over all items, as the paper did).", parser=_float, metavar="<float>")] = None,
    stop_after: Annotated[Optional[int], Opt(help="Stop after this many iterations in this invocation (checkpointed; continue with --resume).", parser=_int, metavar="<int>")] = None,
    quiet: Annotated[bool, Opt("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Train a model on a synthetic task, writing a run directory with checkpoints. Every setting
    (--core, --hidden-size, --vocab-size, …) is named as its config field, as in sweep specs."""
    from gradscope.guard import as_int
    from gradscope.presets import PRESETS, build_config
    from gradscope.train.loop import UnstartedRunWarning, is_run_dir, read_run_config, train

    options: dict[str, Any] = dict(ctx.meta.get(SETTINGS, {}))
    options.update(beta1=beta1, beta2=beta2)
    if max_length is not None:
        if options.get("length") is not None and options["length"] != max_length:
            raise GradscopeError(f"--max-length: got {max_length} and --length {options['length']}; they name the same "
                                 f"setting")
        options["length"] = max_length
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

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UnstartedRunWarning)
            result = train(cfg, run_dir, resume=resume is not None, stop_after=stop_after, on_step=on_step,
                           command=command, extend_from=extend_from if resume is None else None)
        for w in caught:
            if issubclass(w.category, UnstartedRunWarning):
                warn(str(w.message))
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if result:
        print_result(result, run_dir)
    else:
        console.print(f"stopped early; continue with: gradscope train --resume {run_dir}")
