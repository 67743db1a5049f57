"""State-Jacobian throughput: naive autograd and plain torch.func baselines vs gradscope's engine.

What is timed (time.perf_counter; CUDA synchronised before every clock read), in triplets/s. One
triplet = 3 probe sequences (``make_probes``, seeded, balanced over the 4 F/R conditions), and each
sequence needs its full Jacobian J = ∂y_T/∂z_p (D_out × D; T = 2L, p = 1, float32). Every method
starts from the same token ids and the same model, so embedding + the forward pass to z_p count too:
  (i)   per-row  -- per sequence: roll ``core.step`` from z_p (requires_grad) to T, then one
                    ``torch.autograd.grad`` per output row (D_out calls). The naive baseline.
  (ii)  vmap(jacrev) -- ``torch.func.vmap(torch.func.jacrev(f))`` over all sequences, f(z_p) a Python
                    loop of ``core.step`` to T (written here, independent of gradscope's engine).
  (iii) gradscope -- ``state_jacobian(model, tokens, p, method="auto", chunk=3·triplets)``; the
                    resolved engine is shown.
  (iii') chain only -- RNN cores: the resolved engine alone on precomputed inputs and states (no
                    embedding, no forward scan), to isolate the chained Jacobian products.
The slow baselines run on few triplets (RNN: (i) 2, (ii) 8; S4D: 1, 2) and their per-triplet rate
is extrapolated; all methods (plus the matmul references) are timed in alternating blocks and the
median block rate is kept, so a burst of load from other processes hits one block, not one method;
"vs (ii) best" divides by (ii)'s best block (conservative). --quick: 1 round, numbers are noise.
(iii) is checked against (ii)
(and (i) against (ii)) on the shared triplets, reusing each method's untimed warm-up output:
max |ΔJ| / max |J|. RNN recurrent weights W_hh are scaled ×5 so that J is O(1) rather than ~1e-13
(default-init GRU/LSTM over 63 steps); S4D keeps its default init.

GFLOP/s counts only the multiply-adds of the chained Jacobian products that the engine executes,
2 flops each: per sequence and step one (H × D)·(D × H) bmm, i.e. 2·H·D·H (GRU: D = H, 2H³; LSTM:
D = 2H (h, c), 4H³, because ∂c'/∂c is diagonal; the nominal (H × 2H)·(2H × 2H) product would be 8H³)
over T − p steps. Forming J_t elementwise, the forward scan and the readout are not counted. The
references, timed in the same blocks: a float32 2048² matmul and a bmm of the chain's exact shape.

--paper adds H = E = 512, L = 64 (T = 128) GRU and LSTM rows (--paper-only: just those), each job in
a fresh process: (iii) ``probe_stability`` (chunk 32 triplets: Jacobians, SVDs, every score) on
--paper-triplets triplets (default 1024 on CUDA, the goal's size; 32 on the CPU, extrapolated to 1024),
then in the same process the same sequences' Jacobians alone, the engine's chain alone on one chunk,
and the references: a bmm of the chain's exact shape and a 4096² matmul (the device's float32 matmul
rate, measured in this run); (ii) vmap(jacrev) on --paper-vmap triplets (default 4 on CUDA, 1 on the
CPU: 12 LSTM sequences needed more than 22 GiB), checked against gradscope's Jacobians of the same
sequences. Peak memory is over the memory in use once model and probes are built (CPU: VmHWM − VmRSS
at that point; CUDA: max_memory_allocated − memory_allocated), warm-up included. float32 throughout;
the matmul precision in force is printed (torch's default "highest": no TF32).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import os
import platform
import time

import torch
from rich.console import Console
from rich.table import Table
from torch.func import jacrev, vmap

from gradscope.analysis.jacobian import METHODS, resolve_method, state_jacobian
from gradscope.analysis.stability import probe_stability
from gradscope.config import ModelConfig
from gradscope.models import SeqModel
from gradscope.tasks.probes import make_probes

SEED, K, P = 0, 64, 1
CONDITIONS = [("frequent", "frequent"), ("frequent", "rare"), ("rare", "frequent"), ("rare", "rare")]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(core: str, H: int, L: int, device: torch.device, N: int = 64) -> SeqModel:
    torch.manual_seed(SEED)
    cfg = ModelConfig(core=core, vocab_size=K, embed_size=H, hidden_size=H, pe="none", max_len=2 * L,
                      core_config={"state_size": N} if core == "s4d" else None)
    model = SeqModel(cfg)
    if core != "s4d":
        with torch.no_grad():
            model.core.layer_weights(0)[1].mul_(5.0)
    return model.to(device).eval()


def probes(model: SeqModel, n: int, L: int):
    return make_probes(-(-n // 4), L, P, K, CONDITIONS, SEED)


def prefix(model: SeqModel, tokens: torch.Tensor):
    """Inputs x (B, T, in) and z_p (B, D), rolled with core.step (no engine code)."""
    with torch.no_grad():
        x = model.core_inputs(tokens)
        z = model.core.init_state(x.shape[0], x)
        for t in range(P):
            _, z = model.core.step(x[:, t], z)
    return x, z


def per_row(model: SeqModel, tokens: torch.Tensor) -> torch.Tensor:
    """(i): one autograd.grad per output row, one sequence at a time. → (B, D_out, D)."""
    x, zp = prefix(model, tokens)
    out = []
    for s in range(x.shape[0]):
        z0 = zp[s:s + 1].clone().requires_grad_(True)
        z = z0
        for t in range(P, x.shape[1]):
            y, z = model.core.step(x[s:s + 1, t], z)
        out.append(torch.stack([torch.autograd.grad(y[0, i], z0, retain_graph=True)[0][0]
                                for i in range(y.shape[1])]))
    return torch.stack(out)


def vmap_jacrev(model: SeqModel, tokens: torch.Tensor) -> torch.Tensor:
    """(ii): vmap over sequences of jacrev of z_p ↦ y_T through a Python loop of core.step."""
    x, zp = prefix(model, tokens)

    def f(z: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
        zb = z[None]
        for t in range(xs.shape[0]):
            y, zb = model.core.step(xs[t][None], zb)
        return y[0]
    return vmap(jacrev(f))(zp, x[:, P:])


def interleaved(fns: dict, device: torch.device, rounds: int, block_s: float):
    """Work units/s of each fn (name → (fn, units per call)): one warm-up call (its output is
    returned) sizes each block to ~block_s, then ``rounds`` alternating blocks; median block rate kept."""
    reps, first = {}, {}
    for name, (fn, _) in fns.items():
        sync(device)
        tic = time.perf_counter()
        first[name] = fn()
        sync(device)
        reps[name] = max(1, round(block_s / (time.perf_counter() - tic)))
    rates: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, (fn, units) in fns.items():
            sync(device)
            tic = time.perf_counter()
            for _ in range(reps[name]):
                fn()
            sync(device)
            rates[name].append(reps[name] * units / (time.perf_counter() - tic))
    median = {name: sorted(r)[len(r) // 2] for name, r in rates.items()}
    return median, {name: max(r) for name, r in rates.items()}, first


def bench_core(core: str, args, device: torch.device, console: Console):
    H, L = 128, 32
    T = 2 * L
    model = build(core, H, L, device)
    mc = model.core
    s4d = core == "s4d"  # its baselines are 5–50× slower per triplet: time fewer
    n_slow, n_vmap, n_fast = max(1, args.slow // (1 + s4d)), max(1, args.slow_vmap // (1 + 3 * s4d)), args.fast
    tok = probes(model, n_fast, L).model_inputs(model.query_token)[:3 * n_fast].to(device)
    slow, mid = tok[:3 * n_slow], tok[:3 * n_vmap]
    name = resolve_method(mc, "auto")
    fns = {"(i) per-row grad": (lambda: per_row(model, slow), n_slow),
           "(ii) vmap(jacrev)": (lambda: vmap_jacrev(model, mid), n_vmap),
           "(iii) gradscope": (lambda: state_jacobian(model, tok, P, chunk=3 * n_fast), n_fast)}
    if not s4d:
        D = mc.state_dim
        with torch.no_grad():
            x, zs = mc.scan(model.core_inputs(tok))
        fns["(iii') chain only"] = (lambda: torch.no_grad()(METHODS[name])(mc, x, zs, P), n_fast)  # noqa: B023
        a, b = torch.randn(2048, 2048, device=device), torch.randn(2048, 2048, device=device)
        ba, bb = torch.randn(3 * n_fast, H, D, device=device), torch.randn(3 * n_fast, D, H, device=device)
        bout = torch.empty(3 * n_fast, H, H, device=device)
        fns["ref: 2048² matmul"] = (lambda: a @ b, 2 * 2048**3 / 1e9)
        fns["ref: bmm"] = (lambda: torch.bmm(ba, bb, out=bout), 2 * 3 * n_fast * H * D * H / 1e9)
    rates, best, first = interleaved(fns, device, args.rounds, args.block)
    j1, j2 = first["(i) per-row grad"], first["(ii) vmap(jacrev)"].detach()
    j3, top = first["(iii) gradscope"].jac, j2.abs().max()
    check = (f"max|J| {top:.3g}; max|ΔJ|/max|J|: (iii)−(ii) {(j3[:3 * n_vmap] - j2).abs().max() / top:.1e}, "
             f"(i)−(ii) {(j1 - j2[:3 * n_slow]).abs().max() / top:.1e} ({3 * n_vmap} / {3 * n_slow} sequences)")
    info = {"core": core.upper(), "shape": f"{H} × {mc.state_dim}", "method": name, "check": check}
    if not s4d:
        gflop = 3 * (T - P) * 2 * H * D * H / 1e9  # per triplet
        info.update(gflop=gflop, refs=[v for k, v in rates.items() if k.startswith("ref")],
                    bmm=f"{3 * n_fast}×({H}×{D})·({D}×{H})")
    console.print(f"  done: {core} ({check})", style="dim")
    return fns, rates, best, info


def timed(fn, device: torch.device, reps: int = 1) -> float:
    """Seconds per call of fn (one untimed warm-up call first)."""
    fn()
    sync(device)
    tic = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return (time.perf_counter() - tic) / reps


def peak_start(dev: torch.device) -> float:
    """Resident memory now (MiB) and, on CUDA, a fresh peak counter; see ``peak_since``."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        return torch.cuda.memory_allocated(dev) / 2**20
    return proc_status("VmRSS")


def peak_since(dev: torch.device, base: float) -> float:
    """Peak memory (MiB) above ``base`` since ``peak_start``: CUDA max_memory_allocated, CPU VmHWM."""
    if dev.type == "cuda":
        return torch.cuda.max_memory_allocated(dev) / 2**20 - base
    return proc_status("VmHWM") - base


def paper_child(core: str, n: int, chunk: int, device: str, threads: int, job: str) -> dict | None:
    """Fresh process, paper size (H = E = 512, L = 64, T = 128).

    job "gradscope": ``probe_stability`` on n triplets, timed whole (wall, peak memory over the memory
    in use once model and probes are built; a one-triplet warm-up runs first and counts towards the
    peak), then, untimed by the wall: the same sequences' Jacobians alone (``state_jacobian`` per
    chunk), the engine's chain alone on one chunk, and the references in this same process — a bmm of
    the chain's exact shape and a 4096² matmul, both float32.
    job "vmap": ``vmap(jacrev)`` (this file's (ii)) on n triplets' Jacobians, timed and peaked the same
    way, then checked against gradscope's Jacobians of the same sequences (max |ΔJ| / max |J|); None when
    CUDA runs out of memory (on the CPU the kernel kills the process instead: the parent reports it)."""
    if threads:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    L, H = 64, 512
    model = build(core, H, L, dev)
    mc = model.core
    D = mc.state_dim
    pr = probes(model, n, L)
    tok = pr.model_inputs(model.query_token)[:3 * n].to(dev)
    if job == "vmap":
        base = peak_start(dev)
        try:
            vmap_jacrev(model, tok[:3])  # warm-up, one triplet
            sync(dev)
            tic = time.perf_counter()
            jv = vmap_jacrev(model, tok).detach()
            sync(dev)
        except torch.OutOfMemoryError:
            return None
        wall = time.perf_counter() - tic
        peak = peak_since(dev, base)
        jg = state_jacobian(model, tok, P, chunk=3 * n).jac
        top = jv.abs().max()
        return {"wall": wall, "peak": peak, "n": n, "check": float((jg - jv).abs().max() / top), "top": float(top)}
    base = peak_start(dev)
    probe_stability(model, make_probes(1, L, P, K, CONDITIONS[:1], SEED + 1), P, chunk=chunk)  # warm-up
    sync(dev)
    tic = time.perf_counter()
    probe_stability(model, pr, P, chunk=chunk)
    sync(dev)
    wall = time.perf_counter() - tic
    peak = peak_since(dev, base)
    rows = 3 * min(chunk, n)

    def jacobians() -> None:
        for start in range(0, 3 * n, rows):
            state_jacobian(model, tok[start:start + rows], P, chunk=rows)
    sync(dev)
    tic = time.perf_counter()
    jacobians()
    sync(dev)
    jac_s = time.perf_counter() - tic
    name = resolve_method(mc, "auto")
    with torch.no_grad():
        x, zs = mc.scan(model.core_inputs(tok[:rows]))
    chain_s = timed(lambda: torch.no_grad()(METHODS[name])(mc, x, zs, P), dev, 2)
    ba, bb = torch.randn(rows, H, D, device=dev), torch.randn(rows, D, H, device=dev)
    bout = torch.empty(rows, H, H, device=dev)
    bmm_s = timed(lambda: torch.bmm(ba, bb, out=bout), dev, 5)
    a, b = torch.randn(4096, 4096, device=dev), torch.randn(4096, 4096, device=dev)
    mm_s = timed(lambda: a @ b, dev, 5)
    chain_gflop = rows * (2 * L - P) * 2 * H * D * H / 1e9
    return {"wall": wall, "peak": peak, "n": len(pr), "method": name, "rss": base, "jac_s": jac_s,
            "chain": chain_gflop / chain_s, "bmm": 2 * rows * H * D * H / 1e9 / bmm_s,
            "mm": 2 * 4096**3 / 1e9 / mm_s, "chain_shape": f"{rows}×({H}×{D})·({D}×{H})"}


def proc_status(key: str) -> float:
    """MiB from /proc/self/status. VmHWM (peak RSS) is per address space, so unlike ru_maxrss it does not
    inherit the parent's resident size across fork + exec (which spawn does)."""
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith(key + ":")) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="very short run (checks the script works)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--paper", action="store_true", help="add the paper-size (H=512, L=64) GRU/LSTM rows")
    ap.add_argument("--paper-triplets", type=int, default=0,
                    help="triplets timed per paper row (default 1024 on CUDA, 32 on CPU; quick 4)")
    ap.add_argument("--paper-vmap", type=int, default=0,
                    help="triplets for the paper-size vmap(jacrev) baseline (default 4 on CUDA, 1 on CPU)")
    ap.add_argument("--paper-only", action="store_true", help="only the paper-size rows (implies --paper)")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    plan = (1, 1, 4, 1, 0.1) if args.quick else (2, 8, 32, 5, 0.5)
    args.slow, args.slow_vmap, args.fast, args.rounds, args.block = plan
    console = Console(width=200)
    with open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.processor())
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu
    console.print(f"device: {dev_name} ({device.type}) | torch {torch.__version__} | threads {torch.get_num_threads()}"
                  f" of {os.cpu_count()} CPUs (load avg {os.getloadavg()[0]:.1f} at start) | H=128, E=128, L=32 "
                  f"(T=64), p={P}, float32, S4D N=64, pe=none")

    if args.paper_only:
        paper(args, device, console)
        return
    table = Table(title="Full state Jacobians ∂y_T/∂z_p, triplets/s (3 sequences each; higher is better)")
    for col in ("core", "D_out × D", "method", "triplets/call", "triplets/s (median)", "best block", "vs (ii)",
                "vs (ii) best", "vs (i)"):
        table.add_column(col, justify="left" if col in ("core", "method") else "right")
    flops = Table(title="Engine chain GFLOP/s (executed bmm multiply-adds ×2, see docstring) vs matmul, same blocks")
    for col in ("core", "GFLOP/triplet", "bmm shape (chunk)", "(iii) end-to-end", "(iii') chain only", "2048² mm",
                "bmm same shape", "(iii) / bmm", "(iii') / bmm"):
        flops.add_column(col, justify="left" if col == "core" else "right")
    checks = []
    for core in ("gru", "lstm", "s4d"):
        fns, rates, best, info = bench_core(core, args, device, console)
        base, naive, top = rates["(ii) vmap(jacrev)"], rates["(i) per-row grad"], best["(ii) vmap(jacrev)"]
        for i, (label, (_, units)) in enumerate(fns.items()):
            if label.startswith("ref"):
                continue
            method = f"{label} → {info['method']}" if label.startswith("(iii") else label
            table.add_row(info["core"] if i == 0 else "", info["shape"] if i == 0 else "", method, str(units),
                          f"{rates[label]:,.2f}", f"{best[label]:,.2f}", f"{rates[label] / base:,.1f}×",
                          f"{rates[label] / top:,.1f}×", f"{rates[label] / naive:,.0f}×")
        table.add_section()
        checks.append(f"{info['core']}: {info['check']}")
        if "gflop" in info:
            g = info["gflop"]
            e2e, chain = g * rates["(iii) gradscope"], g * rates["(iii') chain only"]
            mm, bmm = info["refs"]
            flops.add_row(info["core"], f"{g:.2f}", info["bmm"], f"{e2e:.1f}", f"{chain:.1f}", f"{mm:.1f}",
                          f"{bmm:.1f}", f"{e2e / bmm:.0%}", f"{chain / bmm:.0%}")
    console.print(table)
    for line in checks:
        console.print("agreement " + line)
    console.print(flops)

    if args.paper:
        paper(args, device, console)


def paper(args, device: torch.device, console: Console) -> None:
    """The paper-size rows (see the module docstring): each core's gradscope run and its vmap(jacrev)
    baseline in fresh processes, one after the other."""
    cuda = device.type == "cuda"
    n = -(-(args.paper_triplets or (4 if args.quick else 1024 if cuda else 32)) // 4) * 4  # whole condition sets
    m = args.paper_vmap or (4 if cuda else 1)  # 12 paper-size LSTM sequences: > 22 GiB
    ptable = Table(title=f"Paper size (H=E=512, L=64, T=128, p={P}, float32): probe_stability, chunk 32 triplets, "
                         f"{n} triplets timed; vmap(jacrev) on {m}; '1024 triplets' scales each by 1024/timed")
    for col in ("core", "D_out × D", "method", "triplets timed", "wall s", "1024 triplets", "Jacobians alone",
                "vs (ii) per triplet", "chain GFLOP/s", "bmm same shape", "chain / bmm", "4096² mm", "peak MiB",
                "agreement"):
        ptable.add_column(col, justify="left" if col in ("core", "method") else "right")
    ctx = mp.get_context("spawn")
    shapes = []

    def fmt(s: float) -> str:
        return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"
    for core in ("gru", "lstm"):
        results = {}
        for job, count in (("gradscope", n), ("vmap", m)):
            with cf.ProcessPoolExecutor(1, mp_context=ctx) as pool:
                try:
                    results[job] = pool.submit(paper_child, core, count, 32, str(device), args.threads, job).result()
                except cf.process.BrokenProcessPool:  # the kernel's OOM killer (vmap(jacrev) at paper size)
                    results[job] = None
            console.print(f"  done: paper {core} {job}: {results[job] or 'the process was killed (out of memory?)'}",
                          style="dim")
        g, v = results["gradscope"], results["vmap"]
        if g is None:
            continue
        if v is None:
            v = {"wall": float("nan"), "n": m, "peak": float("nan"), "check": float("nan"), "top": float("nan")}
        D = 512 * (2 if core == "lstm" else 1)
        per_g, per_v = g["jac_s"] / g["n"], v["wall"] / v["n"]
        ptable.add_row(core.upper(), f"512 × {D}", f"(iii) gradscope ({g['method']})", str(g["n"]), f"{g['wall']:.2f}",
                       fmt(g["wall"] * 1024 / g["n"]), f"{g['jac_s']:.2f} s ({g['jac_s'] / g['wall']:.0%})",
                       f"{per_v / per_g:.1f}×", f"{g['chain']:,.0f}", f"{g['bmm']:,.0f}",
                       f"{g['chain'] / g['bmm']:.0%}", f"{g['mm']:,.0f}", f"{g['peak']:,.0f}", "")
        ptable.add_row("", "", "(ii) vmap(jacrev)", str(v["n"]), f"{v['wall']:.2f}",
                       fmt(v["wall"] * 1024 / v["n"]), "", "1.0×", "", "", "", "", f"{v['peak']:,.0f}",
                       f"{v['check']:.1e}")
        shapes.append(f"{core.upper()} {g['chain_shape']}, max|J| {v['top']:.3g}")
        ptable.add_section()
    console.print(ptable)
    console.print("(ii) times Jacobians only; 'agreement': max|ΔJ|/max|J| of (iii) against (ii) on (ii)'s sequences. "
                  f"bmm shapes (chunk of 32 triplets): {'; '.join(shapes)}.")
    console.print("'Jacobians alone': the same sequences' state_jacobian calls, chunk by chunk, after the timed run (share "
                  "of its wall); the rest of the wall is SVDs, scores and copies to the host. 'vs (ii)': per-triplet "
                  "Jacobian time of vmap(jacrev) over gradscope's Jacobians alone. 'peak MiB': above the memory in use "
                  "once model and probes were built (CUDA: max_memory_allocated; CPU: VmHWM − VmRSS). "
                  f"float32 matmul precision: {torch.get_float32_matmul_precision()} (highest = no TF32).")

if __name__ == "__main__":
    main()
