"""The structure-aware and partial Lyapunov rows of ``bench/dynamics.py`` (issue #23), beside today's
dense engine and the machine's bmm/QR roofline at the same shapes. Imported by bench/dynamics.py.

Rows (all on this machine, float32 models, gradscope's defaults: float64 J·Q/QR/log-sums):
  1. ``gradscope dynamics`` with defaults, every part, on ``sample_checkpoints/s4d-none-s1`` (S4D, H = 128,
     32 complex modes per channel, D = 8,192; 4 checkpoints): the whole workflow in-process
     (``run_checkpoint_dynamics``), wall time. Dense engine beside it: ``lyapunov_spectrum(engine="dense")`` on the
     same checkpoint, timed on --dense-steps steps of ONE trajectory and scaled linearly to the default
     8 × 1000 steps × 4 checkpoints (it forms a D × D J_t and QRs it every step). Roofline: one float64
     (1 × D × D)·(D × D) matmul + one QR of D × D, timed once, × the same steps.
  2. The paper-format S4D (H = 32, N = 32 complex modes, D = 2,048; a checkpoint of that format trained 1
     iteration here, since only the format matters for time): ``gradscope dynamics`` defaults, every part,
     one checkpoint. Dense engine and roofline as in row 1.
  3. LSTM, H = 512 (D = 1,024), 8 trajectories: the top 32 exponents (``exponents=32``: a D × 32 frame
     advanced by JVPs) against the full spectrum (dense Benettin/QR), both on the same --lstm-steps steps
     (warm-up a tenth). Equality: on one trajectory × 400 steps (warm-up 40), the k = 32 run against the
     full run's top 32 at every 40 counted steps (max |Δλ|): the k run is the full run's first 32
     Benettin columns, so the sorted values agree to rounding once the columns' order has settled, and
     differ where λ_32 and λ_33 are closer than the window resolves.
     Roofline: 8 × (bmm (D × D)·(D × D) + QR (D × D)) per step, the full spectrum's unavoidable calls.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from gradscope.analysis.dynamics import trajectory_tokens
from gradscope.analysis.lyapunov import lyapunov_spectrum
from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from gradscope.models import SeqModel
from gradscope.files.checkpoint import load
from gradscope.train import train
from gradscope.workflows.dynamics import DynamicsOptions, run_checkpoint_dynamics, task_trajectories

ROOT = Path(__file__).resolve().parents[1]
S4D_SAMPLE = ROOT / "sample_checkpoints" / "s4d-none-s1"


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    tic = time.perf_counter()
    out = fn()
    return time.perf_counter() - tic, out


def dense_step_seconds(ckpt: Path, steps: int) -> float:
    """Seconds per step and trajectory of today's dense engine (D × D J_t, bmm, QR) on one trajectory."""
    loaded = load(ckpt)
    model = loaded.model.eval()
    x = task_trajectories(model, loaded.config, steps + 1, 1, seed=1).detach()
    lyapunov_spectrum(model.core, x[:, :2], warmup=0, engine="dense")  # untimed: one-off set-up
    t, _ = timed(lambda: lyapunov_spectrum(model.core, x, warmup=1, engine="dense"))
    return t / (steps + 1)


def roofline_step_seconds(D: int, B: int = 1, dtype: torch.dtype = torch.float64) -> float:
    """One (B × D × D)·(D × D) product + one batched QR of B × D × D, the dense engine's unavoidable calls."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(B, D, D, generator=gen, dtype=dtype)
    torch.bmm(a, a)
    t1, _ = timed(lambda: torch.bmm(a, a))
    t2, _ = timed(lambda: torch.geqrf(a))
    return t1 + t2


def paper_s4d_checkpoint(root: Path) -> Path:
    """A paper-format S4D checkpoint (H = 32, N = 32 complex modes, D = 2,048), trained 1 iteration."""
    cfg = RunConfig(model=ModelConfig(core="s4d", vocab_size=64, embed_size=32, hidden_size=32, pe="none", max_len=128,
                                      core_config={"state_size": 64}),
                    task=TaskConfig(name="reverse", vocab_size=64, length=64, heldout_size=64, distribution="dual",
                                    grid_per_cell=2),
                    train=TrainConfig(iterations=1, batch_size=8, lr=1e-3, warmup=1, checkpoint_every=1, seed=0))
    train(cfg, root / "paper-s4d")
    return sorted((root / "paper-s4d").glob("step-*.pt"))[-1]


def s4d_rows(path: Path, label: str, dense_steps: int) -> list[tuple[str, str, float, str]]:
    opts = DynamicsOptions()
    files = sorted(path.glob("step-*.pt")) if path.is_dir() else [path]
    t, run = timed(lambda: run_checkpoint_dynamics([path], opts))
    D = load(files[-1]).model.core.state_dim
    work = opts.trajectories * opts.steps * len(files)
    dense = dense_step_seconds(files[-1], dense_steps) * work
    roof = roofline_step_seconds(D) * work
    plan = run.plan.note if run.plan is not None else ""
    return [(label, f"gradscope dynamics, defaults, every part ({len(files)} ckpt)", t, plan),
            (label, "dense engine, lyapunov alone (today's; scaled)", dense,
             f"{dense_steps} steps × 1 trajectory timed, × {work} step·trajectories"),
            (label, "roofline: float64 matmul + QR of D × D per step (scaled)", roof, "no Jacobians, no state")]


def lstm_rows(steps: int, k: int = 32, B: int = 8) -> tuple[list[tuple[str, str, float, str]], str]:
    torch.manual_seed(0)
    model = SeqModel(ModelConfig(core="lstm", vocab_size=64, embed_size=512, hidden_size=512, pe="none",
                                 max_len=16)).eval()
    with torch.no_grad():
        x = model.core_inputs(trajectory_tokens(64, steps, B, 1))
        x1 = model.core_inputs(trajectory_tokens(64, 400, 1, 2))
    W = max(1, steps // 10)
    lyapunov_spectrum(model.core, x[:, :3], warmup=1, exponents=k)  # untimed set-up
    t_k, part = timed(lambda: lyapunov_spectrum(model.core, x, warmup=W, exponents=k))
    t_full, full = timed(lambda: lyapunov_spectrum(model.core, x, warmup=W))
    long_full = lyapunov_spectrum(model.core, x1, warmup=40, checkpoint_every=40)
    long_part = lyapunov_spectrum(model.core, x1, warmup=40, checkpoint_every=40, exponents=k)
    gaps = (long_full.running[0, :, :k] - long_part.running[0]).abs().amax(-1)
    sep = (long_full.exponents[0, k - 1] - long_full.exponents[0, k]).item()
    delta = (f"top {k} vs the full run's top {k}, 1 trajectory, after "
             + ", ".join(f"{n}: {g:.0e}" for n, g in zip(long_full.running_steps.tolist(), gaps.tolist()))
             + f" counted steps (λ_{k} − λ_{k + 1} = {sep:.1e} at the end)")
    D = model.core.state_dim
    roof = roofline_step_seconds(D, B) * steps
    label = f"LSTM H=512 (D={D})"
    note = f"{B} traj. × {steps} steps (warm-up {W})"
    return [(label, f"gradscope, top {k} exponents (D × {k} frame)", t_k, note),
            (label, "gradscope, full spectrum (dense Benettin/QR)", t_full, note),
            (label, "roofline: float64 bmm + QR of D × D per step", roof, "no Jacobians, no state")], delta


def structure_rows(dense_steps: int, lstm_steps: int) -> tuple[list[tuple[str, str, float, str]], str]:
    """Every row of the structure/partial table, and a line on the k run against the full run's top k."""
    rows = s4d_rows(S4D_SAMPLE, "S4D sample (D=8192)", dense_steps)
    with tempfile.TemporaryDirectory() as tmp:
        rows += s4d_rows(paper_s4d_checkpoint(Path(tmp)), "paper-format S4D (D=2048)", dense_steps)
    more, delta = lstm_rows(lstm_steps)
    return rows + more, delta


__all__ = ["structure_rows"]
