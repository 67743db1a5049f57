"""Sweep wall-clock: the tiny grid (docs/sweep-tiny.toml) run one point after another vs on dask.

What is timed (time.perf_counter around a whole child process, so imports, cluster start-up and
shut-down are included — what a user waits for):

* baseline   -- ``python bench/sweep_workers.py --sequential``: the same points, one after another,
                in one process with no dask, calling the same per-point task
                (``gradscope.workflows.sweep.grid.run_point``: train → accuracy → stability) with
                torch using all the machine's cores;
* gradscope  -- ``gradscope sweep SPEC --workers N`` for N = 1 and 2 (LocalCluster, 1 thread per
                worker process, torch threads = cores / N per task).

Every configuration writes into a fresh directory, and the configurations are run in alternating
rounds (``--rounds``, default 2), median reported, so load from other processes on a shared machine
skews one round rather than one configuration. A roofline line gives float32 2048² matmul GFLOP/s
with 1 thread and with all cores, measured in the same run.

    python bench/sweep_workers.py [--spec docs/sweep-tiny.toml] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def sequential(spec: Path, out: Path) -> None:
    """The baseline: every point of the spec in this process, one after another, no dask."""
    from gradscope.workflows.study.reproduce import Layout
    from gradscope.workflows.sweep.grid import plan_points, read_spec, run_point
    parsed = read_spec(spec)
    for point in plan_points(parsed):
        run_point(point, str(Layout(out).root), parsed.analyses, threads=cores())


def timed(cmd: list[str], cwd: Path) -> float:
    tic = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return time.perf_counter() - tic


def matmul_gflops(threads: int) -> float:
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    best = float("inf")
    for _ in range(5):
        tic = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - tic)
    torch.set_num_threads(before)
    return 2 * 2048**3 / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=REPO / "docs" / "sweep-tiny.toml")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sequential", nargs=2, type=Path, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sequential:
        sequential(*args.sequential)
        return
    from rich.console import Console
    from rich.table import Table

    from gradscope.workflows.sweep.grid import plan_points, read_spec
    spec = args.spec.resolve()
    points = len(plan_points(read_spec(spec)))
    gradscope = [sys.executable, "-c", "from gradscope.cli.app import main; main()", "sweep", str(spec), "-q"]
    configs = {
        f"baseline: sequential, no dask, {cores()} torch threads":
            lambda out: [sys.executable, str(Path(__file__).resolve()), "--sequential", str(spec), str(out)],
        "gradscope sweep --workers 1": lambda out: [*gradscope, "--out", str(out), "--workers", "1"],
        "gradscope sweep --workers 2": lambda out: [*gradscope, "--out", str(out), "--workers", "2"],
    }
    times: dict[str, list[float]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (name, make) in enumerate(configs.items()):
                out = Path(tmp) / f"r{r}-c{i}"
                times[name].append(timed(make(out), Path(tmp)))
                shutil.rmtree(out)
    base = statistics.median(times[next(iter(configs))])
    table = Table(title=f"{spec.name}: {points} points, wall-clock per whole sweep (median of {args.rounds} rounds)",
                  title_justify="left")
    for col in ("configuration", "wall-clock s", "rounds", "points/min", "speed-up vs baseline"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for name, ts in times.items():
        med = statistics.median(ts)
        table.add_row(name, f"{med:.1f}", " ".join(f"{t:.1f}" for t in ts), f"{points / med * 60:.1f}",
                      f"{base / med:.2f}×")
    console = Console(width=120)
    console.print(table)
    console.print(f"roofline: float32 2048² matmul {matmul_gflops(1):.0f} GFLOP/s (1 thread), "
                  f"{matmul_gflops(cores()):.0f} GFLOP/s ({cores()} threads); "
                  f"{platform.processor() or platform.machine()}, {cores()} cores, python {platform.python_version()}")


if __name__ == "__main__":
    main()
