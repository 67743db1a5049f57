"""Start-up cost of the command line (issue #24): what a command pays beyond torch and its own work.

Two tables, in one run:

1. **Commands.** For `gradscope stability`, `accuracy`, `dynamics` and `train`, on small documented
   inputs, each in a fresh process ``--rounds`` times (the minimum is kept):
   - *wall*: the command line, end to end (parse, imports, load, compute, table, write the store);
   - *warm*: the same computation called a second time in one Python process, through the public
     function (``gradscope.stability(...)``, ``gradscope.accuracy(...)``, ``gradscope.dynamics(...)``,
     ``gradscope.train.train(...)``): no imports, no first-call costs;
   - *torch*: ``python -c "import torch"`` (what any command must pay);
   - *overhead* = wall − warm − torch. Goal (issue #24): ≤ 0.5 s.
   The same three in CPU time (user + system of the process) beside them: on a shared, busy
   machine CPU time is the steadier measure of what start-up costs.
2. **Help screens.** ``gradscope --help`` and ``gradscope CMD --help`` beside the floor
   (``python -c pass``) and ``import torch`` (which a help screen must not pay for). Goal ≤ 0.5 s.

Inputs, written to a temporary directory first (deterministic, seed 0):
- stability, accuracy, dynamics: a checkpoint in the layout the paper's public code saves (docs/definitions.md §6),
  the size of the paper analyzer's GRU benchmark: GRU, H = E = 128, K = 64, L = 32, vanilla, with a
  dual-frequency held-out grid (2 × 2 × 16 × 32 × 32), so four conditions;
  - stability: ``--triplets 8`` per condition = 32 triplets, as in the issue;
  - accuracy: defaults (the grid's 2,048 sequences and the uniform set);
  - dynamics: ``--parts flow,spectra,lyapunov --sequences 2 --trajectories 2 --steps 200``;
- train: ``--preset tiny --iterations 100 --checkpoint-every 100 --log-every 50`` (a 1.5k-parameter
  GRU; the point is start-up, not training speed).

Timings on a shared machine are noisy: read the minimum, and compare rows of one run.
Usage: python bench/startup.py [--rounds 3] [--help-rounds 5] [--skip-help]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HELP_COMMANDS = ["", "train", "stability", "accuracy", "dynamics", "summarize", "report", "reproduce", "sweep"]
K, H, L, N = 64, 128, 32, 16  # the paper-format GRU: vocabulary, hidden = embedding, length, grid rows per cell
GOAL = 0.5

# Each command: (CLI arguments after `gradscope`, Python statement run twice in one process, timed the second time).
# {ckpt}, {out} and {run} are filled in per round.
COMMANDS = {
    "stability": (["stability", "{ckpt}", "--triplets", "8", "-q", "-o", "{out}"],
                  "gradscope.stability(ckpt, triplets=8)"),
    "accuracy": (["accuracy", "{ckpt}", "-q", "-o", "{out}"],
                 "gradscope.accuracy(ckpt)"),
    "dynamics": (["dynamics", "{ckpt}", "--parts", "flow,spectra,lyapunov", "--sequences", "2", "--trajectories", "2",
                  "--steps", "200", "-q", "-o", "{out}"],
                 "gradscope.dynamics(ckpt, parts='flow,spectra,lyapunov', sequences=2, trajectories=2, steps=200)"),
    "train": (["train", "--preset", "tiny", "--iterations", "100", "--checkpoint-every", "100", "--log-every", "50",
               "-q", "-o", "{run}"],
              "train(cfg, next_run())"),
}

WARM = """
import sys, tempfile, time, itertools
from pathlib import Path
import gradscope
ckpt = Path(sys.argv[1])
if {train}:
    from gradscope.presets import build_config
    from gradscope.train import train
    cfg = build_config("tiny", {{"iterations": 100, "checkpoint_every": 100, "log_every": 50}})
    root = Path(tempfile.mkdtemp())
    counter = itertools.count()
    next_run = lambda: root / f"run{{next(counter)}}"
{stmt}
tic, cpu = time.perf_counter(), time.process_time()
{stmt}
print(time.perf_counter() - tic, time.process_time() - cpu)
"""


def paper_gru_checkpoint(path: Path) -> Path:
    """A checkpoint in the paper code's layout (docs/definitions.md §6): GRU, H = E = 128, K = 64, L = 32, no PE, a
    dual-frequency held-out grid; weights at nn.GRU's default init (seed 0), recurrent weights × 3 so
    that the Jacobians are not ~0."""
    import torch
    from torch import nn

    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    emb, rnn, logits = nn.Embedding(K + 1, H), nn.GRU(H, H, batch_first=True), nn.Linear(H, K)
    with torch.no_grad():
        rnn.weight_hh_l0.mul_(3.0)
    sd = {"embedding.weight": emb.weight.detach().clone(),
          **{f"rnn.{k}": v.detach().clone() for k, v in rnn.state_dict().items()},
          **{f"to_logits.{k}": v.detach().clone() for k, v in logits.state_dict().items()}}
    half = K // 2
    grid = torch.empty(2, 2, N, L, L, dtype=torch.long)
    for t in range(2):
        for d in range(2):
            grid[t, d] = torch.randint(0, half, (N, L, L), generator=gen) + d * half
            pos = torch.arange(L)
            grid[t, d, :, pos, pos] = torch.randint(0, half, (N, L), generator=gen) + t * half
    ckpt = {"modules": {"rnn": {"module_name": "RNN", "state_dict": sd, "init_args": {
        "vocab_size": K, "hidden_size": H, "rnn_name": "GRU", "embed_size": H, "time_encoding": None,
        "time_encoding_form": "sinusoidal", "max_length": 2 * L, "num_layers": 1, "dropout": 0.0,
        "learnable_padding_token": False}}},
        "optimizer": {}, "scheduler": {}, "random_seed": 111, "iteration": 299_999, "held_out_data": grid}
    torch.save(ckpt, path)
    return path


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wall(argv: list[str], rounds: int, fill: dict[str, str] | None = None,
         scratch: Path | None = None) -> tuple[float, float]:
    """Minimum wall time and minimum CPU time (user + system) of ``argv`` over ``rounds`` fresh
    processes ({out}/{run} fresh each round)."""
    times, cpus = [], []
    for r in range(rounds):
        args = [a.format(**(fill or {}), out=str(scratch / f"out-{r}.zarr") if scratch else "",
                         run=str(scratch / f"run-{r}") if scratch else "") for a in argv]
        cpu, tic = _child_cpu(), time.perf_counter()
        done = subprocess.run(args, capture_output=True)
        times.append(time.perf_counter() - tic)
        cpus.append(_child_cpu() - cpu)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(args)} failed: {done.stderr.decode()[-800:]}")
        if scratch is not None:
            for p in scratch.iterdir():
                if p.name.startswith(("out-", "run-")):
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
    return min(times), min(cpus)


def warm(stmt: str, ckpt: Path, rounds: int, train: bool) -> tuple[float, float]:
    """Minimum over ``rounds`` processes of the second call of ``stmt`` in one process: wall and CPU."""
    code = WARM.format(stmt=stmt, train=train)
    times, cpus = [], []
    for _ in range(rounds):
        done = subprocess.run([sys.executable, "-c", code, str(ckpt)], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"in-process {stmt} failed: {done.stderr[-800:]}")
        w, c = map(float, done.stdout.strip().splitlines()[-1].split())
        times.append(w)
        cpus.append(c)
    return min(times), min(cpus)


def load() -> str:
    try:
        one, five, _ = os.getloadavg()
        return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"
    except OSError:
        return "load unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per command row (min kept)")
    parser.add_argument("--help-rounds", type=int, default=5, help="fresh processes per help row (min kept)")
    parser.add_argument("--skip-help", action="store_true", help="only the command table")
    parser.add_argument("--only", default=",".join(COMMANDS), help="comma-separated commands of table 1")
    args = parser.parse_args()
    exe = shutil.which("gradscope") or str(Path(sys.executable).parent / "gradscope")
    if not Path(exe).exists():
        raise SystemExit("gradscope is not on PATH: install the project first (pip install .)")
    print(f"# {load()} at start")
    torch_s, torch_cpu = wall([sys.executable, "-c", "import torch"], max(args.rounds, 3))
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        ckpt = paper_gru_checkpoint(scratch / "checkpoint_after-300000-iters.pt")
        rows = []
        for name in args.only.split(","):
            argv, stmt = COMMANDS[name]
            w, wc = wall([exe, *argv], args.rounds, {"ckpt": str(ckpt)}, scratch)
            c, cc = warm(stmt, ckpt, args.rounds, name == "train")
            rows.append((name, w, c, w - c - torch_s, wc, cc, wc - cc - torch_cpu))
        print(f"\n1. command start-up: overhead = wall - warm - torch ('import torch': {torch_s:.2f} s wall, "
              f"{torch_cpu:.2f} s CPU); goal <= {GOAL} s (wall); min of {args.rounds}. CPU = user + system time "
              f"of the process (the work uses 2 threads, the imports one): on a busy machine it is steadier")
        print(f"{'command':<10} {'wall s':>7} {'warm s':>7} {'overhead s':>10}  goal   | {'CPU s':>6} {'warm CPU':>8} "
              f"{'overhead CPU':>12}")
        for name, w, c, over, wc, cc, over_cpu in rows:
            print(f"{name:<10} {w:7.2f} {c:7.2f} {over:10.2f}  {'met   ' if over <= GOAL else 'MISSED'} | {wc:6.2f} "
                  f"{cc:8.2f} {over_cpu:12.2f}")
    if not args.skip_help:
        floor = wall([sys.executable, "-c", "pass"], args.help_rounds)[0]
        helps = [(f"gradscope {cmd} --help".replace("  ", " "), wall([exe, *([cmd] if cmd else []), "--help"],
                                                                      args.help_rounds)[0]) for cmd in HELP_COMMANDS]
        width = max(len(n) for n, _ in helps)
        print(f"\n2. help screens: min of {args.help_rounds}; goal <= {GOAL} s "
              f"(python -c pass {floor:.2f} s, import torch {torch_s:.2f} s)")
        for name, t in helps:
            print(f"{name:<{width}}  {t:6.2f}")
    print(f"\n# {load()} at end")


if __name__ == "__main__":
    main()
