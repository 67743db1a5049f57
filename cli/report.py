"""`gradscope report`: parse → gradscope.store.inputs (load) → gradscope.reports (figures, HTML) → write."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape  # paths are text, never markup

from gradscope.errors import GradscopeError

from gradscope.workflows.study.options import ReportOptions  # torch-free: --help builds the options from it

from .common import SETTINGS, command_line, make_console, refuse_given
from .errors import user_errors
from .generated import build_options, generated_command

console = make_console()
Opt = typer.Option


def check_out(out: Path, overwrite: bool) -> None:
    if not out.parent.is_dir():
        raise GradscopeError(f"--out: directory {out.parent} does not exist")
    if out.is_dir():
        raise GradscopeError(f"--out: {out} is a directory; give an .html file path")
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise GradscopeError(f"--out: {out} already exists; choose another path or pass --overwrite")


# the drawing options (each --<field>, its help and default from ReportOptions' field) are generated
ReportCommand = generated_command(ReportOptions, after="out")


@user_errors
def report_command(
    ctx: typer.Context,
    inputs: Annotated[Optional[list[Path]], typer.Argument(help="Stability, accuracy, dynamics or summary stores and run directories (any mix), sweep directories, or folders of them.", show_default=False)] = None,
    out: Annotated[Path, Opt("--out", "-o", help="HTML file to write (self-contained, works offline).")] = Path("report.html"),
    overwrite: Annotated[bool, Opt(help="Replace an existing report.")] = False,
) -> None:
    """Render stores and runs into one offline HTML report (plots, table of contents, provenance).
    The drawing options (--static … --title) are ReportOptions' fields."""
    from gradscope.reports import export_static, render_report
    from gradscope.store.inputs import load_inputs
    from gradscope.files.io import atomic_write

    # every option is checked in ReportOptions.__post_init__, before any input is read
    opts = build_options(ReportOptions, ctx.meta.get(SETTINGS, {}))
    check_out(out, overwrite)
    items = load_inputs(list(inputs or []))
    if not any(i.kind == "stability" for i in items):  # only stability stores are bootstrapped and scored here
        refuse_given(ctx, ["score", "resamples", "seed"], "they set the stability figures, and no input is a "
                     "stability store")
    opts = dataclasses.replace(opts, command=command_line(ctx))
    page, sections = render_report(items, opts=opts)
    images = export_static(sections, out, opts.static, overwrite) if opts.static else []
    # exclusive without --overwrite: a report that appeared meanwhile is not replaced
    atomic_write(out, lambda tmp: tmp.write_text(page, encoding="utf-8"), overwrite=overwrite, what="--out")
    figures = sum(s.figure is not None for s in sections)
    console.print(escape(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, {figures} figures: "
                  f"{', '.join(s.id for s in sections if s.figure is not None)})"), soft_wrap=True)
    for path in images:
        console.print(escape(f"wrote {path}"), soft_wrap=True)
