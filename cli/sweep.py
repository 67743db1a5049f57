"""`gradscope sweep`: a TOML grid → train → accuracy → stability per point on dask.distributed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from gradscope.errors import GradscopeError

from gradscope.workflows.study.options import ClusterOptions, SweepOptions  # torch-free: --help builds the options from it

from .common import SETTINGS, command_line, make_console
from .errors import user_errors
from .generated import build_options, generated_command
from .progress import make_progress

if TYPE_CHECKING:
    from gradscope.workflows.sweep.cluster import Tally
    from gradscope.workflows.sweep.grid import SweepPoint, SweepSpec
    from rich.table import Table

console = make_console()
Opt = typer.Option


def plan_table(spec: SweepSpec, points: list[SweepPoint], done: set[str]) -> Table:
    from rich.table import Table

    table = Table(title=f"sweep {spec.name!r}: {len(points)} grid points (preset {spec.preset}; "
                        f"{', '.join(f'{a} × {len(v)}' for a, v in spec.axes)})", title_justify="left")
    for col in ("point", *(a for a, _ in spec.axes), "iterations", "status"):
        table.add_column(col)
    for p in points:
        table.add_row(p.name, *(str(v) for _, v in p.axes), f"{p.run.config.train.iterations:,}",
                      "done" if p.name in done else "to run")
    return table


def _previous(out: Path, spec: SweepSpec) -> dict[str, dict[str, Any]]:
    """The points an earlier run of this sweep recorded, by name; refuses a sweep directory whose
    analyses differ from this spec's (their stores would mix settings)."""
    from gradscope.store.manifest import manifest_path, read_manifest

    if manifest_path(out) is None:
        return {}
    doc = read_manifest(out)
    if doc.get("analyses") is not None and doc["analyses"] != spec.analyses.describe():
        raise GradscopeError(f"--out: {out} holds a sweep whose analyses ([accuracy]/[stability]) differ from this "
                             f"spec's; its stores would mix settings. Choose another --out or restore the spec")
    return {e.get("name"): e for e in doc["points"]}


# where the points run (each --<field>, its help and default from ClusterOptions' field) is generated, and --dry-run
# (SweepOptions')
SweepCommand = generated_command(ClusterOptions, "out", SweepOptions)


@user_errors
def sweep_command(
    ctx: typer.Context,
    spec_file: Annotated[Path, typer.Argument(metavar="SPEC.toml", help="Sweep spec (TOML): preset, settings, axes, analyses. Example: docs/sweep-tiny.toml.", show_default=False)],
    out: Annotated[Optional[Path], Opt("--out", "-o", help="Sweep directory (default: sweep-<spec name>). Re-running skips finished points and resumes half-trained runs.")] = None,
    quiet: Annotated[bool, Opt("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Run a grid of train → accuracy → stability tasks on dask.distributed, resumably. Where the points
    run (--scheduler … --retries) is ClusterOptions' fields."""
    from gradscope.store.manifest import write_manifest
    from gradscope.workflows.sweep.cluster import check_workers, dashboard_link, open_client, run_sweep, Tally
    from gradscope.workflows.study.reproduce import Layout
    from gradscope.workflows.sweep.grid import check_existing, manifest_entry, plan_points, point_finished, read_spec

    opts = build_options(ClusterOptions, ctx.meta.get(SETTINGS, {}))  # checked first, in its __post_init__
    dry_run = build_options(SweepOptions, ctx.meta.get(SETTINGS, {})).dry_run
    if opts.scheduler is None and opts.workers is not None:
        check_workers(opts)  # the memory of the workers asked for, before the spec is read or anything written
    spec = read_spec(spec_file)
    points = plan_points(spec)
    out = out if out is not None else Path(f"sweep-{spec.name}")  # the name is one plain component
    if out.exists() and not out.is_dir():
        raise GradscopeError(f"--out: {out} is a file; give a directory")
    layout = Layout(out)
    check_existing(points, layout)
    before = _previous(out, spec)
    finished = {p.name for p in points if point_finished(p, layout, spec.analyses)}
    if dry_run:
        console.print(plan_table(spec, points, finished))
        return
    todo = [p for p in points if p.name not in finished]
    command = command_line(ctx)
    header = {"name": spec.name, "spec": spec_file.read_text(), "command": command,
              "analyses": spec.analyses.describe()}
    entries = {p.name: ({**before[p.name], "status": "done"} if p.name in finished and p.name in before else
                        manifest_entry(p, layout, spec.analyses, "done" if p.name in finished else "pending"))
               for p in points}  # finished points keep what the manifest recorded when they ran
    out.mkdir(parents=True, exist_ok=True)
    write_manifest(out, header, list(entries.values()))
    by_name = {p.name: p for p in points}
    tic = time.perf_counter()
    tally = Tally(total=len(todo))
    if todo:
        with open_client(opts, len(todo)) as client:
            link = dashboard_link(client)
            info = client.scheduler_info()
            console.print(f"{len(todo)} of {len(points)} points to run on {len(info['workers'])} worker(s) "
                          f"({'scheduler ' + opts.scheduler if opts.scheduler else 'local cluster'})"
                          + (f"; dashboard: {link}" if link else ""), soft_wrap=True)
            recorded: set[str] = set()

            def on_finish(t: Tally) -> None:
                for o in t.finished:
                    if o.name not in recorded:
                        entries[o.name] = manifest_entry(by_name[o.name], layout, spec.analyses, "done", o)
                        recorded.add(o.name)
                for name, error in t.failures.items():
                    if name not in recorded:
                        entries[name] = manifest_entry(by_name[name], layout, spec.analyses, "failed", error=error)
                        recorded.add(name)
                write_manifest(out, header, list(entries.values()))

            with make_progress(console, "running", "failed") as progress:
                bar = progress.add_task(f"sweep {spec.name}", total=len(todo), running=0, failed=0, visible=not quiet)

                def on_update(t: Tally) -> None:
                    progress.update(bar, completed=t.done + t.failed, running=t.running, failed=t.failed)

                tally = run_sweep(client, todo, out, spec.analyses, opts, command, on_update, on_finish)
    _print_summary(tally, len(points) - len(todo), time.perf_counter() - tic, out)
    if tally.failed:
        raise typer.Exit(1)


def _print_summary(tally: Tally, earlier: int, seconds: float, out: Path) -> None:
    from rich.table import Table

    if tally.finished:
        table = Table(title="points run now", title_justify="left")
        for col in ("point", "train", "accuracy", "stability", "seconds", "worker (threads)"):
            table.add_column(col, justify="right" if col == "seconds" else "left")
        for o in sorted(tally.finished, key=lambda o: o.name):
            steps: dict[str, Any] = dict(o.steps)
            table.add_row(o.name, steps.get("train", "-"), steps.get("accuracy", "-"), steps.get("stability", "-"),
                          f"{o.seconds:.1f}", f"{o.worker} ({o.threads})")
        console.print(table)
    if tally.failures:
        table = Table(title=f"[red]{len(tally.failures)} point(s) failed[/]", title_justify="left")
        table.add_column("point")
        table.add_column("error")
        for name, error in sorted(tally.failures.items()):
            table.add_row(name, error)
        console.print(table)
    console.print(f"{tally.done} point(s) done now, {earlier} done earlier, {tally.failed} failed, in {seconds:.1f} s; "
                  f"index: {out / 'sweep.json'}", soft_wrap=True)
    if tally.failed:
        console.print("re-run the same command to retry the failed points (finished ones are skipped)")
    else:
        console.print(f"next: gradscope summarize {out} --kind accuracy   ·   gradscope report {out}", soft_wrap=True)
