"""Training throughput: a per-sample DataLoader pipeline vs gradscope's vectorised batch maker.

What is timed (time.perf_counter; CUDA synchronised before every clock read):

* Table 1 -- whole training steps, in tokens/s (tokens = batch B x sequence length T = 2L per
  step, the full input+output rows). One step = get a batch + forward + cross-entropy
  (ignore_index=-100) + backward + clip_grad_norm_(1.0) + Adam, as ``gradscope.train.loop`` does.
  The model, its initial weights (same seed), the optimizer and the step are identical for both
  pipelines; only the batch source differs:
    baseline  -- an ``IterableDataset`` that builds ONE sequence at a time with Python ``random``
                 (dual-frequency choice per token), rejects it if its input row is in a Python
                 ``set`` of held-out tuples, returns per-sample tensors; ``DataLoader(batch_size=B,
                 num_workers=0)`` collates them and the batch is moved to the device (the way the
                 paper's reference code fed its model);
    gradscope -- ``sample_excluding(task, B, generator, Excluder(...))`` on the device.
  Both reject against the same held-out set, gradscope's ``build_heldout`` (uniform + grid rows).
  Warm-up steps are run first and not timed. The two pipelines are timed in alternating blocks
  (up to 5 per pipeline) and the median block rate is reported, so that load from other processes
  on a shared machine skews one block rather than one pipeline.
* Table 2 -- data generation alone, in batches/s, for the same two sources.
* Table 3 -- the language-model task (``--task lm``, issue #27): the tiny lm study's configuration
  (corpus from CPython's pydoc_data/topics.py, SentencePiece 1,024, first 128 tokens per paragraph,
  LSTM E=64, H=128, batch 32), vanilla and sinusoidal PE. Whole training steps as above; the
  baseline batch source reads one paragraph at a time from the memory-mapped split and pads the
  batch with ``pad_sequence``; gradscope's is ``LanguageModel.sample`` (one vectorised gather).
  tokens/s counts the real (scored) paragraph tokens, the mean per batch measured on 200 batches.
* A roofline line: float32 2048x2048 matmul GFLOP/s with the threads in use, measured in this run.

Configs: "tiny" = the ``tiny`` preset (K=16, L=8, E=32, H=64, batch 64, dual-frequency reverse);
"paper" = E=H=512, K=64, L=64, batch 512, reverse with the dual-frequency distribution (the
paper's setting; the ``paper`` preset itself says uniform). Each with a GRU and an LSTM core.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import random
import time

import torch
from rich.console import Console
from rich.table import Table
from torch.utils.data import DataLoader, IterableDataset

from gradscope.models import SeqModel
from gradscope.workflows.study.lm import lm_base, prepare_study_corpus
from gradscope.presets import PRESETS
from gradscope.tasks import Batch, Excluder, build_heldout, make_task, sample_excluding
from gradscope.tasks.base import IGNORE

SEED = 111


def make_config(name: str, core: str):
    base = PRESETS[name]
    task = base.task if name == "tiny" else dataclasses.replace(base.task, distribution="dual")
    model = dataclasses.replace(base.model, core=core, vocab_size=task.vocab_size,
                                max_len=max(base.model.max_len, 2 * task.length))
    return dataclasses.replace(base, task=task, model=model)


class PerSampleReverse(IterableDataset):
    """Baseline: one dual-frequency reverse sequence per item, rejected one by one."""

    def __init__(self, tcfg, heldout_rows: set[tuple[int, ...]], seed: int) -> None:
        self.k, self.length, self.rarity = tcfg.vocab_size, tcfg.length, tcfg.rarity
        self.heldout, self.rng = heldout_rows, random.Random(seed)

    def _token(self) -> int:
        half, rng = self.k // 2, self.rng
        return rng.randrange(half, self.k) if rng.random() < self.rarity else rng.randrange(0, half)

    def __iter__(self):
        query = [self.k] * self.length
        while True:
            x = [self._token() for _ in range(self.length)]
            row = tuple(x + query)
            if row in self.heldout:
                continue  # a held-out sequence: draw again
            yield torch.tensor(row), torch.tensor([IGNORE] * self.length + x[::-1])


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batch_sources(cfg, device: torch.device):
    """(baseline, gradscope) zero-argument batch makers sharing one held-out set."""
    task = make_task(cfg.task)
    rows = build_heldout(task, cfg.train.seed).exclusion_rows(task)
    loader = DataLoader(PerSampleReverse(cfg.task, {tuple(r) for r in rows.tolist()}, SEED),
                        batch_size=cfg.train.batch_size, num_workers=0)
    it = iter(loader)

    def baseline() -> Batch:
        inputs, targets = next(it)
        return Batch(inputs.to(device), targets.to(device))

    excluder, gen = Excluder(rows).to(device), torch.Generator(device=device).manual_seed(SEED + 1)
    return baseline, lambda: sample_excluding(task, cfg.train.batch_size, gen, excluder)


def make_step(cfg, next_batch, device: torch.device):
    """One training step (model and Adam built here, weights seeded the same for every pipeline)."""
    torch.manual_seed(SEED)
    model = SeqModel(cfg.model).to(device).train()
    t = cfg.train
    opt = torch.optim.Adam(model.parameters(), lr=t.lr, betas=t.betas, eps=t.eps)

    def step() -> None:
        batch = next_batch()
        logits = model(batch.inputs)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(),
                                                 ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return step


def interleaved_rates(fns, device: torch.device, warmup: int, n: int, rounds: int) -> list[float]:
    """Calls/s of each fn: warm-up, then ``rounds`` alternating timed blocks (n calls in all per fn);
    the median block rate is kept, so a burst of load from other processes hits one block, not one fn."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    sizes = [n // rounds + (r < n % rounds) for r in range(rounds)]
    rates: list[list[float]] = [[] for _ in fns]
    for size in sizes:
        for fn, out in zip(fns, rates):
            sync(device)
            tic = time.perf_counter()
            for _ in range(size):
                fn()
            sync(device)
            out.append(size / (time.perf_counter() - tic))
    return [sorted(r)[len(r) // 2] for r in rates]


def roofline(device: torch.device, n: int = 2048, reps: int = 5) -> float:
    g = torch.Generator().manual_seed(SEED)
    a, b = (torch.randn(n, n, generator=g).to(device) for _ in range(2))
    a @ b
    sync(device)
    tic = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - tic) / 1e9


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    return names[0] if names else platform.processor() or "unknown CPU"


def lm_sources(cfg, device: torch.device):
    """(baseline, gradscope) batch makers for the lm task: paragraphs drawn uniformly from train."""
    task = make_task(cfg.task)
    split, length, query, batch = task.corpus.splits["train"], cfg.task.length, task.query, cfg.train.batch_size
    rng = random.Random(SEED)

    def baseline() -> Batch:
        inputs, targets = [], []
        for _ in range(batch):
            words = torch.tensor(split.paragraph(rng.randrange(len(split)))[:length], dtype=torch.long)
            inputs.append(torch.cat([torch.tensor([query]), words[:-1]]))
            targets.append(words)
        pad = torch.nn.utils.rnn.pad_sequence
        return Batch(pad(inputs, batch_first=True, padding_value=query).to(device),
                     pad(targets, batch_first=True, padding_value=IGNORE).to(device))

    gen = torch.Generator(device=device).manual_seed(SEED + 1)
    return baseline, lambda: task.sample(batch, gen)


def lm_table(device: torch.device, warmup: int, steps: int) -> Table:
    import tempfile
    from pathlib import Path

    table = Table(title="Language model (--task lm, tiny study): training steps, real tokens/s")
    for col in ("model", "B", "tokens/batch", "steps (warm-up)", "baseline tok/s", "gradscope tok/s", "speed-up"):
        table.add_column(col, justify="left" if col == "model" else "right")
    with tempfile.TemporaryDirectory() as tmp:
        base_cfg = lm_base("tiny", prepare_study_corpus("tiny", Path(tmp)))
        for pe in ("none", "sinusoidal"):
            cfg = dataclasses.replace(base_cfg, model=dataclasses.replace(base_cfg.model, pe=pe))
            sources = lm_sources(cfg, device)
            probe = lm_sources(cfg, device)[1]
            per_batch = sum(int((probe().targets != IGNORE).sum()) for _ in range(200)) / 200
            fns = [make_step(cfg, src, device) for src in sources]
            base, fast = (per_batch * r for r in interleaved_rates(fns, device, warmup, steps, min(steps, 5)))
            table.add_row(f"LSTM {'vanilla' if pe == 'none' else 'PE'}", str(cfg.train.batch_size), f"{per_batch:.0f}",
                          f"{steps} ({warmup})", f"{base:,.0f}", f"{fast:,.0f}", f"{fast / base:.2f}×")
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="very short run (checks the script works)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--steps", type=int, default=0, help="timed steps for every config (default: per config)")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    random.seed(SEED), torch.manual_seed(SEED)
    gpu = device.type == "cuda"
    # (warm-up, timed) steps per config; the paper config is slow on a CPU.
    plan = {"tiny": (5, 30) if args.quick else (20, 200),
            "paper": ((1, 3) if args.quick else (3, 20)) if gpu else ((0, 1) if args.quick else (1, 3))}
    if args.steps:
        plan = {k: (w, args.steps) for k, (w, _) in plan.items()}
    console = Console()
    gflops = roofline(device)
    console.print(f"device: {device_name(device)} ({device.type}) | torch {torch.__version__} | "
                  f"threads {torch.get_num_threads()} | float32 2048² matmul roofline {gflops:.0f} GFLOP/s")

    table = Table(title="Training throughput (tokens/s = B × T per step; higher is better)")
    for col in ("config", "model", "B × T", "steps (warm-up)", "baseline tok/s", "gradscope tok/s", "speed-up"):
        table.add_column(col, justify="left" if col in ("config", "model") else "right")
    for name in ("tiny", "paper"):
        warmup, steps = plan[name]
        for core in ("gru", "lstm"):
            cfg = make_config(name, core)
            steps_fns = [make_step(cfg, src, device) for src in batch_sources(cfg, device)]
            tokens = cfg.train.batch_size * 2 * cfg.task.length
            base, fast = (tokens * r for r in interleaved_rates(steps_fns, device, warmup, steps, min(steps, 5)))
            table.add_row(name, core.upper(), f"{cfg.train.batch_size} × {2 * cfg.task.length}",
                          f"{steps} ({warmup})", f"{base:,.0f}", f"{fast:,.0f}", f"{fast / base:.2f}×")
            console.print(f"  done: {name} {core}", style="dim")
    console.print(table)

    gen_table = Table(title="Data generation alone (batches/s, incl. held-out rejection and move to device)")
    for col in ("config", "batch", "baseline batches/s", "gradscope batches/s", "speed-up"):
        gen_table.add_column(col, justify="left" if col == "config" else "right")
    for name, n in (("tiny", 50 if args.quick else 500), ("paper", 3 if args.quick else 20)):
        cfg = make_config(name, "gru")
        base, fast = interleaved_rates(batch_sources(cfg, device), device, 2, n, min(n, 5))
        gen_table.add_row(name, str(cfg.train.batch_size), f"{base:,.1f}", f"{fast:,.1f}", f"{fast / base:.1f}×")
    console.print(gen_table)
    console.print(lm_table(device, *((2, 10) if args.quick else (5, 60))))


if __name__ == "__main__":
    main()
