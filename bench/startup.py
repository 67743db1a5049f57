"""Start-up time of the command line: `gradscope --help` and `gradscope CMD --help`, side by side with
the floor (`python -c pass`) and bare `import torch` (what a help screen must not pay for).

Each command runs in a fresh process ``--rounds`` times; the table shows min and median wall time.
Usage: python bench/startup.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS = ["", "train", "stability", "accuracy", "summarize", "report", "reproduce", "sweep"]


def wall(argv: list[str], rounds: int) -> tuple[float, float]:
    times = []
    for _ in range(rounds):
        tic = time.perf_counter()
        done = subprocess.run(argv, capture_output=True)
        times.append(time.perf_counter() - tic)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.decode()[-500:]}")
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    exe = shutil.which("gradscope")
    if exe is None:
        raise SystemExit("gradscope is not on PATH: install the project first (pip install .)")
    rows = [("python -c pass (floor)", wall([sys.executable, "-c", "pass"], args.rounds)),
            ("python -c 'import torch' (what help avoids)", wall([sys.executable, "-c", "import torch"], args.rounds))]
    for cmd in COMMANDS:
        rows.append((f"gradscope {cmd} --help".replace("  ", " "), wall([exe, *([cmd] if cmd else []), "--help"], args.rounds)))
    width = max(len(name) for name, _ in rows)
    print(f"{'command':<{width}}  {'min s':>7}  {'median s':>8}   (goal: help <= 0.5 s)")
    for name, (lo, med) in rows:
        print(f"{name:<{width}}  {lo:7.3f}  {med:8.3f}")


if __name__ == "__main__":
    main()
