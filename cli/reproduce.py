"""`gradscope reproduce`: the whole study in one resumable command (thin wrapper over the workflow)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gradscope.errors import GradscopeError

from gradscope.workflows.study.options import ReproduceOptions, StudyOptions, TextStudyOptions  # torch-free: --help builds them

from .common import SETTINGS, command_line, make_console, refuse_given
from .errors import user_errors
from .generated import build_options, generated_command
from .progress import make_progress
from .summarize import summary_table

if TYPE_CHECKING:
    from gradscope.workflows.study.reproduce import Layout, PlannedRun
    from rich.table import Table

console = make_console()
Opt = typer.Option


def plan_table(runs: list[PlannedRun], measure: bool) -> Table:
    from rich.table import Table

    import torch
    from gradscope.workflows.study.reproduce import estimate_seconds

    table = Table(title="plan: train → accuracy → stability over checkpoints → summarize → report",
                  title_justify="left")
    for col in ("run", "parameters", "iterations", "training tokens", "≈ training FLOPs",
                *(("≈ CPU time (measured steps)",) if measure else ())):
        table.add_column(col, justify="left" if col == "run" else "right")
    estimates = estimate_seconds(runs) if measure else {}
    for r in runs:
        row = [r.name, f"{r.parameters:,}", f"{r.config.train.iterations:,}", f"{r.tokens:.3g}", f"{r.train_flops:.3g}"]
        if measure:
            row.append(f"{estimates[r.name] / 60:.1f} min")
        table.add_row(*row)
    if measure:
        table.caption = (f"total ≈ {sum(estimates.values()) / 3600:.2f} h of training on this machine's CPU "
                         f"({torch.get_num_threads()} threads)")
    return table


# the study's options (each --<field>, its help and default from StudyOptions' field) are generated, then what the
# command runs (--dry-run, --measure, --model-dir: ReproduceOptions') and the options of the study of a pretrained LM
# on a text (--text … --budget-seconds, TextStudyOptions' fields)
ReproduceCommand = generated_command(StudyOptions, None, ReproduceOptions, TextStudyOptions)


@user_errors
def reproduce_command(
    ctx: typer.Context,
    out: Annotated[Path, Opt("--out", "-o", help="Study directory (re-running it skips finished steps).")] = Path("study"),
    quiet: Annotated[bool, Opt("--quiet", "-q", help="No progress bars.")] = False,
) -> None:
    """Train vanilla and PE models × seeds, then accuracy, stability, summaries and a report;
    with --extend-to, the vocabulary-extension experiment too. With --model-dir DIR --text FILE: a
    pretrained LM's accuracy, stability and dynamics by token frequency on a raw text, and the report.
    The study's options (--study … --extend-iterations) are StudyOptions' fields, --dry-run … --model-dir
    ReproduceOptions', the text study's (--text … --budget-seconds) TextStudyOptions'."""
    settings = ctx.meta.get(SETTINGS, {})
    mode = build_options(ReproduceOptions, settings)
    model_dir, dry_run, measure = mode.model_dir, mode.dry_run, mode.measure
    study_fields = {f.name for f in dataclasses.fields(StudyOptions)}
    text_options = ["model_dir",
                    *(f.name for f in dataclasses.fields(TextStudyOptions) if "help" in f.metadata)]
    text_fields = {f.name for f in dataclasses.fields(TextStudyOptions)}
    text = settings.get("text")
    if model_dir is not None or text is not None:
        if model_dir is None or text is None:
            raise GradscopeError("--model-dir/--text: they go together: gradscope reproduce --model-dir DIR --text FILE "
                                 "-o OUT")
        refuse_given(ctx, ["study", "scale", "corpus_text", "valid_file", "test_file", "models", "seeds", "iterations",
                           "dry_run", "measure", "extend_to", "extend_iterations"],
                     "they set the studies that train their own models (--study); --text studies --model-dir")
        # the flags StudyOptions shares with it (triplets, target_pos, probe_length): left out, its own defaults
        opts = build_options(TextStudyOptions, {k: v for k, v in settings.items() if k in text_fields})
        text_study(model_dir, opts, out, command_line(ctx), quiet)
        return
    refuse_given(ctx, text_options, "they go with --model-dir DIR --text FILE (a pretrained LM on raw text)")
    from gradscope.workflows.study.reproduce import plan_study, run_study

    if not dry_run:
        refuse_given(ctx, ["measure"], "it goes with --dry-run")
    options = build_options(StudyOptions, {k: v for k, v in settings.items() if k in study_fields})  # checked in __post_init__
    planned = plan_study(options, out)
    if dry_run:
        console.print(plan_table(planned.runs, measure))
        return
    runs, command = planned.runs, command_line(ctx)
    with make_progress(console, "step") as progress:
        overall = progress.add_task("study", total=3 * len(runs), step="", visible=not quiet)
        bars = {}

        def on_train(r: "PlannedRun", i: int) -> None:
            if r.name not in bars:
                bars[r.name] = progress.add_task(f"  {r.name}", total=r.config.train.iterations, step="train",
                                                 visible=not quiet)
            progress.update(bars[r.name], completed=i)

        def on_step(name: str, r: "PlannedRun | None", what: str) -> None:
            if name == "train" and r is not None and r.name in bars:
                progress.update(bars[r.name], completed=r.config.train.iterations, step=what, visible=False)
            progress.update(overall, step=f"{name} {r.name if r is not None else ''}")
            progress.advance(overall)

        result = run_study(planned, command=command, on_train=on_train, on_step=on_step,
                           on_event=None if quiet else lambda s, m: console.print(f"{s}: {m}", markup=False))
    for kind, entries in result.summaries.items():
        metrics = list(dict.fromkeys(e.metric for e in entries))
        shown = [m for m in metrics if (m.startswith("stability/same-target/") if kind == "stability"
                                        else "/bin" not in m and m != "dl_distance")]
        console.print(summary_table([e for e in entries if e.metric in shown], 0.95, "percentile", "trial"))
    report = study_report(planned.layout, runs, command)
    console.print(f"study in {out}: runs/, stores/, summary-accuracy.zarr, summary-stability.zarr, {report.name}")
    if result.extension is not None:
        console.print(result.extension, markup=False)  # "[low, high]" is text, not rich markup


def text_study(model_dir: Path, opts: TextStudyOptions, out: Path, command: str,
               quiet: bool) -> None:
    """``reproduce --model-dir DIR --text FILE``: gradscope.workflows.text.study, then the report."""
    from rich.markup import escape

    from gradscope.workflows.text.study import reproduce_text

    study = reproduce_text(model_dir, out=out, opts=opts, command=command,
                           on_step=None if quiet else lambda step, note: console.print(escape(f"{step}: {note}")))
    report = write_report(list(study.stores.values()), out / "report.html",
                          f"gradscope reproduce: {model_dir.name} on {Path(opts.text).name}", command)
    console.print(escape(f"study in {out}: {', '.join(p.name for p in study.stores.values())}, {report.name}"))


def study_report(layout: Layout, runs: list[PlannedRun], command: str = "") -> Path:
    """One offline HTML report over every run's training log and stores, and the summaries."""
    paths = [layout.run(r) for r in runs] + [p for r in runs for p in (layout.accuracy(r), layout.stability(r))]
    paths += [p for p in (layout.summary_accuracy, layout.summary_stability) if p.exists()]
    return write_report(paths, layout.report, "gradscope reproduce: vanilla vs positional encoding", command)


def write_report(paths: list[Path], report: Path, title: str, command: str) -> Path:
    """The offline HTML report over ``paths`` (runs and stores), written atomically to ``report``."""
    from gradscope.files.io import atomic_write_text
    from gradscope.reports.build import render_report
    from gradscope.store.inputs import load_inputs

    page, _ = render_report(load_inputs(paths), title=title, command=command)
    atomic_write_text(report, page)
    return report
