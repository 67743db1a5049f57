"""Issue #17, the CPU experiment: does the vanilla GRU's stability gap open with 10× longer training?

The study's GRU pair (dual-frequency reverse, K = 64, L = 16, E = 64, H = 128, batch 128, lr 3e-3,
seed 1; vanilla and sinusoidal PE) trained for 60,000 iterations with checkpoints every 5,000.
Training outlives a session, so the runs live in this repository and resume exactly:

    python experiments/fig5_cpu.py train     # start or resume both runs (nice 19, one thread each)
    python experiments/fig5_cpu.py pack      # before a session ends: strip all but each run's latest checkpoint
    python experiments/fig5_cpu.py status

``pack`` keeps every checkpoint for the analysis but drops the optimizer state of all except the
latest (stripped checkpoints analyse, the latest one resumes). See docs/fig5-at-scale.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gradscope.train.checkpoint import list_checkpoints
from gradscope.train.io import safe_load
from gradscope.train.samples import strip_checkpoint

ROOT = Path(__file__).resolve().parent / "fig5-cpu"
RUNS = {pe: ROOT / f"gru-{pe}-s1" for pe in ("none", "sinusoidal")}
COMMON = ["--preset", "tiny", "--model", "gru", "--embed", "64", "--hidden", "128", "--vocab", "64", "--length", "16",
          "--distribution", "dual", "--rarity", "0.125", "--heldout", "1024", "--grid-per-cell", "16",
          "--iterations", "60000", "--batch-size", "128", "--lr", "0.003", "--warmup", "200",
          "--checkpoint-every", "5000", "--log-every", "100", "--seed", "1", "--threads", "1", "-q"]


def train() -> None:
    procs = []
    for pe, run in RUNS.items():
        if (run / "eval.json").exists():
            continue
        args = ["--resume", str(run), "-q"] if (run / "config.json").exists() else [*COMMON, "--pe", pe, "-o", str(run)]
        procs.append(subprocess.Popen(["nice", "-n", "19", "gradscope", "train", *args]))
    sys.exit(max((p.wait() for p in procs), default=0))


def pack() -> None:
    for run in RUNS.values():
        found = list_checkpoints(run) if run.is_dir() else []
        for ckpt in found[:-1]:
            if not safe_load(ckpt).get("stripped"):
                strip_checkpoint(ckpt, ckpt)
        print(run.name, [p.name for p in found])


def status() -> None:
    for run in RUNS.values():
        lines = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []
        last = json.loads(lines[-1]) if lines else {}
        print(f"{run.name}: iteration {last.get('iteration', 0)}, checkpoints "
              f"{[p.name for p in list_checkpoints(run)] if run.is_dir() else []}, "
              f"{'finished' if (run / 'eval.json').exists() else 'running or resumable'}")


if __name__ == "__main__":
    {"train": train, "pack": pack, "status": status}[sys.argv[1] if len(sys.argv) > 1 else "status"]()
