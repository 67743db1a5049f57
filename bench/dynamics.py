"""Lyapunov spectrum throughput (issues #16, #29): three baselines vs gradscope's ``lyapunov_spectrum``, and
the machine's bmm + QR roofline, measured in one run, with each baseline's accuracy checked in float64.

Task: all D Lyapunov exponents of a GRU (D = H = 128) and an LSTM (D = 2H = 256, h and c) over
32 trajectories of T = 1000 steps (warm-up 100), CPU, QR at every step. Models: ``SeqModel`` at default
init (seed 0, vocab 64, E = H = 128, no PE, one layer); inputs: ``model.core_inputs`` of dual-frequency
tokens (``trajectory_tokens``, seed 1). Every method returns natural-log exponents per step, sorted
descending, log-sums in float64.
  per-step autograd loop: one trajectory at a time; per step ``torch.autograd.functional.jacobian`` of
      the fused ``nn.GRU``/``nn.LSTM`` step (one backward pass per state dimension), ``J @ Q``,
      ``torch.linalg.qr``. Very slow: timed on --a-steps steps × --a-trajectories trajectories (warm-up
      0) and scaled linearly per step·trajectory.
  published method (calc_LEs_an, re-implemented from its description): Vogt et al., "On Lyapunov
      Exponents for RNNs" (code: ``lyapunov.py`` of shlizee/lyapunov-hyperopt; no code copied). Batched
      over trajectories; per step the step Jacobian, the frame advanced by one bmm, one batched
      ``torch.linalg.qr`` with R's diagonal made positive (Q's columns flipped to match); the state
      advanced by the fused module. Jacobians as that code forms them: Elman and GRU analytic, with the
      diagonal factors as dense ``diag_embed`` matrices multiplied by bmm (GRU: 7 products of B·H³ each,
      Elman: 1) — gradscope forms the same J by row scaling in O(B·H²). The published analytic LSTM
      Jacobian is ∂h'/∂h with c held fixed, not the Jacobian of the state (h, c); for the full LSTM
      state this bench uses the same method's autograd path instead (its ``calc_Jac``: one batched
      backward pass per state dimension through the fused ``nn.LSTM`` step, here on h and c), named
      "autograd path". Run in BOTH conventions: J·Q (the Benettin recursion gradscope uses) and Jᵀ·Q
      (what the published code does: the transposed cocycle, whose finite-window spectrum differs, so
      its Δλ is large by construction). Differences from the published loop, all deliberate: natural
      log (it reports log₂; divide by ln 2), float64 log-sums (it sums float32 log₂ r), and the warm-up is
      the first W steps of the same input sequence with a QR at every step (it multiplies W Jacobians
      without a QR, orthonormalises once, then feeds the whole sequence again from its first input).
  vmap(jacrev) + QR: per step ``vmap(jacrev)`` of gradscope's functional ``core.step`` over the 32
      trajectories, ``torch.bmm``, batched ``torch.linalg.qr``.
  gradscope: ``lyapunov_spectrum(core, x, warmup=100, qr_dtype=float32)`` (analytic step Jacobians, geqrf +
      householder_product), timed with a float32 QR like the baselines; its default since issue #23 is a
      float64 J·Q, QR and log-sums ("gradscope, float64 QR (default)" row, timed once on the window).
  roofline: the calls this algorithm cannot avoid, alone: per step one float32 bmm
      (32 × D × D)·(D × D) and one batched ``torch.linalg.qr`` (32 × D × D), in a plain loop.
Timing (float32) on a shared machine: the methods run in --rounds interleaved rounds — the batched ones
and the roofline on the first W + --window steps of all 32 trajectories, the per-step autograd loop on
its own subset — and each keeps its median per-step time, scaled linearly to T (× 32 for the loop); the
ratio column (method time / gradscope time) compares these interleaved numbers, so a burst of load from
other processes hits one round, not one method. gradscope's full T × 32 run is timed once as well
("full run"). "% of roofline" = roofline time / method time.
Accuracy (float64, separate from the timing): the model and the same inputs cast to float64 (exact);
every baseline and gradscope rerun on them — the batched baselines on the timing window (W + --window
steps × 32 trajectories, warm-up W), the per-step autograd loop on its subset (warm-up 0, against
gradscope on the same subset) — and max |Δλ| over all D exponents is printed. Asserted: < 1e-6 for
every J·Q method (measured at the default sizes: GRU ~1e-14; LSTM ~3e-8, all of it in two neighbouring
exponents of the deep tail, λ ≈ −7, with equal and opposite errors; median over exponents 1e-15). float32 is not compared: its strongly contracted tail carries ~1e-2 of rounding in
every method (see FACTS). Also asserted: gradscope's window exponents equal its full run's running
estimate at that step.
Threads: --threads (default 1: on this shared 2-core machine a second thread made small BLAS calls
several times slower whenever another process was busy; see FACTS).
Duration: the default run takes ~12–15 min on the 2-core machine (LSTM ~3/4 of it, mostly the
published method's autograd path, 256 backward passes per step); a smoke run, ~10 s:
  python bench/dynamics.py --hidden 32 --steps 60 --warmup 10 --window 20 --trajectories 4
      --a-steps 5 --a-trajectories 1 --rounds 1   (one line)
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import time
from typing import Callable

import torch
from rich.console import Console
from rich.table import Table
from torch import Tensor
from torch.func import jacrev, vmap

from gradscope.analysis.dynamics import trajectory_tokens
from gradscope.analysis.lyapunov import lyapunov_spectrum
from gradscope.config import ModelConfig
from gradscope.models import SeqModel

SEED, K = 0, 64
AGREE = 1e-6  # float64 max |Δλ| every J·Q method must reach against gradscope on the same inputs
LOOP = "per-step autograd loop"
PUBLISHED = "published method (calc_LEs_an, re-implemented from its description)"
VMAP = "vmap(jacrev) + QR"


def build(core: str, H: int, seed: int = SEED) -> SeqModel:
    torch.manual_seed(seed)
    return SeqModel(ModelConfig(core=core, vocab_size=K, embed_size=H, hidden_size=H, pe="none", max_len=16)).eval()


# ---------------------------------------------------------------------------------------------
# Baseline 1: per-step autograd loop

def fused_step(model: SeqModel, x: Tensor, z: Tensor) -> Tensor:
    """One step through the fused module: one input (in,), state (D,) → new state (D,)."""
    rnn, H = model.core.rnn, model.config.hidden_size
    if isinstance(rnn, torch.nn.LSTM):
        _, (h, c) = rnn(x[None, None], (z[None, None, :H], z[None, None, H:]))
        return torch.cat([h[0, 0], c[0, 0]])
    return rnn(x[None, None], z[None, None])[1][0, 0]


def autograd_loop(model: SeqModel, x: Tensor, warmup: int) -> Tensor:
    """Per trajectory, per step autograd.functional.jacobian + J @ Q + QR. x (B, T, in) → exponents (B, D)."""
    D, out = model.core.state_dim, []
    for s in range(x.shape[0]):
        z, Q = x.new_zeros(D), torch.eye(D, dtype=x.dtype)
        logs = torch.zeros(D, dtype=torch.float64)
        for t in range(x.shape[1]):
            J = torch.autograd.functional.jacobian(lambda v: fused_step(model, x[s, t], v), z)  # noqa: B023
            Q, R = torch.linalg.qr(J @ Q)
            if t >= warmup:
                logs += R.diagonal().abs().double().log()
            with torch.no_grad():
                z = fused_step(model, x[s, t], z)
        out.append(logs / (x.shape[1] - warmup))
    return torch.stack(out).sort(dim=-1, descending=True).values


# ---------------------------------------------------------------------------------------------
# Baseline 2: the published method (calc_LEs_an), batched, from its description

def _single_layer(rnn: torch.nn.RNNBase) -> None:
    assert rnn.num_layers == 1 and rnn.bias and not rnn.bidirectional and rnn.batch_first, \
        "the published-method baseline here handles one batch-first layer with biases"


def published_jacobian_analytic(rnn: torch.nn.RNNBase, x: Tensor, h: Tensor) -> Tensor:
    """∂h'/∂h of a fused ``nn.RNN`` (tanh) or ``nn.GRU`` layer, x (B, in), h (B, H) → (B, H, H), with
    the diagonal factors as dense (B, H, H) matrices multiplied by bmm, as the published code forms it."""
    _single_layer(rnn)
    d = torch.diag_embed
    w_ih, w_hh, b_ih, b_hh = rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0
    gi, gh = x @ w_ih.T + b_ih, h @ w_hh.T + b_hh  # (B, G·H) each
    if isinstance(rnn, torch.nn.GRU):
        w_r, w_u, w_n = w_hh.chunk(3)
        (i_r, i_u, i_n), (h_r, h_u, h_n) = gi.chunk(3, dim=-1), gh.chunk(3, dim=-1)
        r, u = torch.sigmoid(i_r + h_r), torch.sigmoid(i_u + h_u)
        n = torch.tanh(i_n + r * h_n)
        # h' = (1 − u) n + u h: through u, through n (its r gate and its W_hn h), and the carry u
        via_u = d(h - n) @ d(u * (1 - u)) @ w_u  # (B, H, H)
        via_n = d(1 - u) @ d(1 - n * n) @ (d(r) @ w_n + d(h_n) @ d(r * (1 - r)) @ w_r)  # (B, H, H)
        return d(u) + via_u + via_n
    assert isinstance(rnn, torch.nn.RNN) and rnn.nonlinearity == "tanh", f"no analytic Jacobian for {rnn}"
    h_new = torch.tanh(gi + gh)
    return d(1 - h_new * h_new) @ w_hh


def published_jacobian_autograd(rnn: torch.nn.RNNBase, x: Tensor, z: Tensor) -> Tensor:
    """The method's autograd path: ∂z'/∂z of the fused layer, one backward pass per state dimension,
    each batched over the trajectories (a sum over them, which are independent). x (B, in), z (B, D)
    → (B, D, D); for an LSTM z = [h, c] (the published path differentiates h' by h only)."""
    _single_layer(rnn)
    with torch.enable_grad():
        parts = [p.detach().requires_grad_() for p in (z.chunk(2, dim=-1) if isinstance(rnn, torch.nn.LSTM) else (z,))]
        if isinstance(rnn, torch.nn.LSTM):
            _, (h, c) = rnn(x[:, None], (parts[0][None], parts[1][None]))
            new = torch.cat([h[0], c[0]], dim=-1)  # (B, D)
        else:
            new = rnn(x[:, None], parts[0][None])[1][0]
        rows = [torch.cat(torch.autograd.grad(new[:, i].sum(), parts, retain_graph=True), dim=-1)
                for i in range(new.shape[1])]
    return torch.stack(rows, dim=1)  # (B, D, D): row i = ∂z'_i/∂z


def _fused_advance(rnn: torch.nn.RNNBase, x: Tensor, z: Tensor) -> Tensor:
    """The state after one step of the fused module: x (B, in), z (B, D) → (B, D)."""
    if isinstance(rnn, torch.nn.LSTM):
        h, c = z.chunk(2, dim=-1)
        _, (h, c) = rnn(x[:, None], (h[None].contiguous(), c[None].contiguous()))
        return torch.cat([h[0], c[0]], dim=-1)
    return rnn(x[:, None], z[None])[1][0]


def published_method(model: SeqModel, x: Tensor, warmup: int, *, transpose: bool, path: str | None = None) -> Tensor:
    """calc_LEs_an re-implemented, batched: per step J (analytic for Elman/GRU, else the autograd path;
    ``path`` forces one), M = Jᵀ·Q (``transpose``, as published) or J·Q, Q R = qr(M) with diag R made
    positive, log r summed after ``warmup`` steps. x (B, T, in) → natural-log exponents (B, D), sorted."""
    rnn = model.core.rnn
    analytic = not isinstance(rnn, torch.nn.LSTM) if path is None else path == "analytic"
    jacobian = published_jacobian_analytic if analytic else published_jacobian_autograd
    B, T, _ = x.shape
    D = model.core.state_dim
    z = x.new_zeros(B, D)
    Q = torch.eye(D, dtype=x.dtype).repeat(B, 1, 1)  # (B, D, D)
    logs = torch.zeros(B, D, dtype=torch.float64)
    with torch.no_grad():
        for t in range(T):
            J = jacobian(rnn, x[:, t], z)  # (B, D, D)
            z = _fused_advance(rnn, x[:, t], z)
            Q, R = torch.linalg.qr(torch.bmm(J.mT if transpose else J, Q))
            sign = R.diagonal(dim1=1, dim2=2).sign()  # (B, D)
            Q = Q * sign[:, None, :]
            if t >= warmup:
                logs += (R.diagonal(dim1=1, dim2=2) * sign).double().log()
    return (logs / (T - warmup)).sort(dim=-1, descending=True).values


# ---------------------------------------------------------------------------------------------
# Baseline 3: vmap(jacrev) + QR

def vmap_jacrev(model: SeqModel, x: Tensor, warmup: int) -> Tensor:
    """Per step vmap(jacrev) of core.step over trajectories, bmm, batched QR. x (B, T, in) → exponents (B, D)."""
    core = model.core
    B, T, _ = x.shape
    D = core.state_dim

    def new_state(xi: Tensor, zi: Tensor) -> Tensor:
        return core.step(xi[None], zi[None])[1][0]

    jac = vmap(jacrev(new_state, argnums=1))
    z, Q = x.new_zeros(B, D), torch.eye(D, dtype=x.dtype).repeat(B, 1, 1)
    logs = torch.zeros(B, D, dtype=torch.float64)
    with torch.no_grad():
        for t in range(T):
            Q, R = torch.linalg.qr(torch.bmm(jac(x[:, t], z), Q))
            if t >= warmup:
                logs += R.diagonal(dim1=1, dim2=2).abs().double().log()
            z = core.step(x[:, t], z)[1]
    return (logs / (T - warmup)).sort(dim=-1, descending=True).values


# ---------------------------------------------------------------------------------------------
# Roofline and timing

def timed(fn: Callable[[], object]) -> tuple[float, object]:
    tic = time.perf_counter()
    out = fn()
    return time.perf_counter() - tic, out


def roofline_loop(B: int, D: int, steps: int) -> float:
    """Seconds for ``steps`` × (one float32 bmm (B × D × D)·(D × D) + one batched linalg.qr (B × D × D)),
    the calls the algorithm cannot avoid, alone (no Jacobians, no state), on fixed random matrices."""
    gen = torch.Generator().manual_seed(SEED)
    a, b = torch.randn(B, D, D, generator=gen), torch.randn(B, D, D, generator=gen)
    out = torch.empty(B, D, D)
    tic = time.perf_counter()
    for _ in range(steps):
        torch.bmm(a, b, out=out)
        torch.linalg.qr(out)
    return time.perf_counter() - tic


def bmm_qr_split(B: int, D: int, reps: int = 5) -> tuple[float, float]:
    """Median seconds of one bmm and of one batched linalg.qr at the roofline's shapes (the footnote)."""
    gen = torch.Generator().manual_seed(SEED)
    a, b = torch.randn(B, D, D, generator=gen), torch.randn(B, D, D, generator=gen)
    out = torch.empty(B, D, D)

    def median(fn: Callable[[], object]) -> float:
        return sorted(timed(fn)[0] for _ in range(reps))[reps // 2]
    return median(lambda: torch.bmm(a, b, out=out)), median(lambda: torch.linalg.qr(a))


def methods(model: SeqModel) -> list[tuple[str, str, Callable[[SeqModel, Tensor, int], Tensor], str]]:
    """(key, table label, exponents(model, x, warmup), note) of the batched methods, gradscope last."""
    lstm = isinstance(model.core.rnn, torch.nn.LSTM)
    how = ", autograd path" if lstm else ""
    why = "; LSTM: autograd path on (h, c), the published analytic J is on h with c fixed" if lstm else ""
    return [
        ("pub_jq", f"{PUBLISHED}{how}, J·Q", lambda m, x, w: published_method(m, x, w, transpose=False),
         f"J·Q as gradscope; natural log (published: log₂){why}"),
        ("pub_jtq", f"{PUBLISHED}{how}, Jᵀ·Q", lambda m, x, w: published_method(m, x, w, transpose=True),
         "Jᵀ·Q as published: the transposed cocycle, a different spectrum on finite windows; Δλ expected"),
        ("vmap", VMAP, vmap_jacrev, ""),
        ("gs", "gradscope lyapunov_spectrum, float32 QR", lambda m, x, w: lyapunov_spectrum(
            m.core, x, warmup=w, qr_dtype=x.dtype).exponents, "as the baselines: float32 J·Q and QR"),
    ]


def bench_core(core: str, args: argparse.Namespace, console: Console) -> dict:
    """Interleaved float32 rounds on a window of W + --window steps (the loop on its own small subset), then
    gradscope's full run, then the float64 accuracy reruns. Per-step times are the median over rounds."""
    H, T, B, W, win = args.hidden, args.steps, args.trajectories, args.warmup, args.warmup + args.window
    model = build(core, H)
    D = model.core.state_dim
    with torch.no_grad():
        x = model.core_inputs(trajectory_tokens(K, T, B, SEED + 1))  # (B, T, in)
    at, ab = args.a_steps, args.a_trajectories
    xa, xw = x[:ab, :at].contiguous(), x[:, :win].contiguous()
    batched = methods(model)
    for _, _, fn, _ in batched:
        fn(model, x[:, :3], 1)  # untimed warm-up: first calls pay one-off dispatch and torch.func set-up
    autograd_loop(model, x[:1, :2], 1)
    roofline_loop(B, D, 2)
    times: dict[str, list[float]] = {k: [] for k in ["loop", "roof", "bmm", "qr"] + [m[0] for m in batched]}
    for r in range(args.rounds):
        times["loop"].append(timed(lambda: autograd_loop(model, xa, 0))[0] / (at * ab))  # per step·trajectory
        for key, _, fn, _ in batched:
            times[key].append(timed(lambda: fn(model, xw, W))[0] / win)  # noqa: B023  per step, all B
        times["roof"].append(roofline_loop(B, D, win) / win)
        bmm_s, qr_s = bmm_qr_split(B, D)
        times["bmm"].append(bmm_s)
        times["qr"].append(qr_s)
        console.print(f"  {core} round {r + 1}: ms/step " + ", ".join(
            f"{k} {1e3 * (B if k == 'loop' else 1) * v[-1]:.1f}" for k, v in times.items() if k not in ("bmm", "qr")),
            style="dim")
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    t_full, res = timed(lambda: lyapunov_spectrum(model.core, x, warmup=W, qr_dtype=torch.float32))
    console.print(f"  {core}: gradscope full run {t_full:.1f} s", style="dim")
    t_f64, _ = timed(lambda: lyapunov_spectrum(model.core, xw, warmup=W))  # the default: float64 J·Q and QR
    res_w = lyapunov_spectrum(model.core, xw, warmup=W, qr_dtype=torch.float32)
    assert torch.equal(res.running[:, list(res.running_steps).index(win - W)], res_w.exponents)

    # accuracy: float64 model and inputs (exact casts), every method against gradscope on the same inputs
    m64, xw64, xa64 = copy.deepcopy(model).double(), xw.double(), xa.double()
    ref = lyapunov_spectrum(m64.core, xw64, warmup=W).exponents
    delta = {key: float((fn(m64, xw64, W) - ref).abs().max()) for key, _, fn, _ in batched if key != "gs"}
    delta["loop"] = float((autograd_loop(m64, xa64, 0) - lyapunov_spectrum(m64.core, xa64, warmup=0).exponents)
                          .abs().max())
    console.print(f"  {core}: float64 max |Δλ| vs gradscope " + ", ".join(f"{k} {v:.1e}" for k, v in delta.items()),
                  style="dim")
    bad = {k: v for k, v in delta.items() if k != "pub_jtq" and not v < AGREE}
    assert not bad, f"{core}: J·Q methods disagree with gradscope in float64 beyond {AGREE:g}: {bad}"

    gs = med["gs"] * T
    rows = [(LOOP, med["loop"] * T * B, f"{at} steps × {ab} traj. ×{args.rounds}", f"{delta['loop']:.1e}",
             "one trajectory at a time; warm-up 0 in the Δλ check")]
    on = f"{win} steps × {B} traj. ×{args.rounds}"
    rows += [(label, med[key] * T, on, "reference" if key == "gs" else f"{delta[key]:.1e}", note)
             for key, label, _, note in batched]
    rows.append(("gradscope lyapunov_spectrum, float32 QR, full run", t_full, f"{T} steps × {B} traj. ×1", "—",
                 "timed once"))
    rows.append(("gradscope, float64 QR (default)", t_f64 / win * T, f"{win} steps × {B} traj. ×1", "—",
                 "float64 J·Q, QR and log-sums: the accurate default"))
    rows.append(("roofline: bmm + linalg.qr alone", med["roof"] * T, on, "", "no Jacobians, no state"))
    return {"core": core.upper(), "D": D, "rows": rows, "gs": gs, "roof": med["roof"] * T, "bmm": med["bmm"],
            "qr": med["qr"], "lam_max": float(res.exponents[:, 0].mean()),
            "lam_min": float(res.exponents[:, -1].mean())}


def structure_table(args: argparse.Namespace, console: Console) -> None:
    """The structure-aware and partial rows (bench/structure_rows.py), one table."""
    from structure_rows import structure_rows  # a sibling module of this script

    rows, delta = structure_rows(args.dense_steps, args.lstm_steps)
    table = Table(title="Structure-aware and partial Lyapunov spectra (issue #23): gradscope beside today's dense "
                        "engine and the roofline at the same shapes, wall seconds")
    for col in ("model", "what", "seconds", "× gradscope", "note"):
        table.add_column(col, justify="right" if col in ("seconds", "× gradscope") else "left", overflow="fold")
    for i, (model, what, t, note) in enumerate(rows):
        base = next(r[2] for r in rows if r[0] == model)
        table.add_row(model, what, f"{t:,.1f}", f"{t / base:,.1f}", note,
                      end_section=i + 1 < len(rows) and rows[i + 1][0] != model)
    console.print(table)
    console.print(f"LSTM, max |Δλ| of the {delta} (float64 QR and log-sums, float32 Jacobians)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--trajectories", type=int, default=32)
    parser.add_argument("--a-steps", type=int, default=20, help="steps of the per-step autograd loop's subset")
    parser.add_argument("--a-trajectories", type=int, default=2, help="trajectories of that subset")
    parser.add_argument("--window", type=int, default=50, help="counted steps of the interleaved window")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cores", default="gru,lstm", help="comma-separated: gru, lstm, elman")
    parser.add_argument("--suite", default="all", choices=("all", "baselines", "structure"),
                        help="baselines: the table above; structure: the structure-aware / partial rows (issue #23)")
    parser.add_argument("--dense-steps", type=int, default=2, help="steps of the dense engine timed per S4D row")
    parser.add_argument("--lstm-steps", type=int, default=40, help="steps of the LSTM top-k vs full rows")
    args = parser.parse_args()
    assert args.warmup + args.window <= args.steps, "--warmup + --window must not exceed --steps"
    torch.set_num_threads(args.threads)
    console = Console(width=200)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    console.print(f"{stamp} · {platform.processor() or platform.machine()} · {os.cpu_count()} CPUs · "
                  f"torch {torch.__version__} · {torch.get_num_threads()} thread(s) · load avg "
                  f"{os.getloadavg()[0]:.1f} at start")
    if args.suite in ("all", "structure"):
        structure_table(args, console)
    if args.suite == "structure":
        return
    results = [bench_core(core, args, console) for core in args.cores.split(",")]
    T, B = args.steps, args.trajectories
    table = Table(title=f"Lyapunov spectrum, all D exponents: T = {T} steps (warm-up {args.warmup}) × {B} "
                        f"trajectories; timed in float32, QR every step; Δλ in float64 on the same inputs")
    for col in ("core (D)", "method", "timed on", f"s for {T}×{B}", "ms per step·traj.", "× gradscope's time",
                "% of roofline", "max |Δλ| vs gradscope, float64", "note"):
        table.add_column(col, justify="left" if col in ("core (D)", "method", "timed on", "note") else "right",
                         overflow="fold")
    for res in results:
        name = f"{res['core']} ({res['D']})"
        for i, (label, t, on, delta, note) in enumerate(res["rows"]):
            table.add_row(name, label, on, f"{t:.1f}", f"{1e3 * t / (T * B):.2f}", f"{t / res['gs']:.2f}",
                          f"{100 * res['roof'] / t:.0f}%", delta, note, end_section=i == len(res["rows"]) - 1)
    console.print(table)
    for res in results:
        D = res["D"]
        gflops = 2 * B * D ** 3 / res["bmm"] / 1e9
        console.print(f"{res['core']}: roofline calls (medians) = bmm {B}×({D}×{D})·({D}×{D}) "
                      f"{1e3 * res['bmm']:.2f} ms ({gflops:.0f} GFLOP/s) + linalg.qr {B}×{D}×{D} "
                      f"{1e3 * res['qr']:.2f} ms; full run: mean "
                      f"λ_max {res['lam_max']:+.4f}, λ_min {res['lam_min']:+.4f} (natural log per step)")
    console.print("Rows other than the full run: timed on the stated subsets in interleaved rounds (median kept) "
                  f"and scaled linearly to {T} steps × {B} trajectories (per step·trajectory for the loop, per step "
                  "for the batched ones); '× gradscope's time' compares those interleaved numbers (the full run's "
                  "with the interleaved gradscope number). Δλ: float64 reruns on the same inputs — batched methods "
                  "on the timing window (warm-up as above), the loop on its own subset (warm-up 0). The published "
                  "tool reports log₂: its numbers are these divided by ln 2.")


if __name__ == "__main__":
    main()
