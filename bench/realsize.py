"""The dynamics plan's estimate against measured cost (issue #37 parts 1, 2 and 5), in one run.

Table 1 (``--samples``, default on): ``gradscope dynamics DIR`` with defaults on every shipped sample
(sample_checkpoints/*, every checkpoint of the run): the plan's estimated seconds and bytes (before any
work, :func:`gradscope.workflows.dynamics.plan_dynamics`) beside the measured wall time and peak memory
(``resource.getrusage`` maxrss of a fresh subprocess per item, which runs the same workflow and writes
the same store as the CLI). Estimated bytes include :data:`~gradscope.workflows.dynamics_cost.PROCESS_BYTES`
for the interpreter itself.

Table 2 (``--realsize``): transformers Mamba with mamba-130m's configuration (24 layers, d_model 768,
D = 700,416) and RWKV with RWKV-4-169m's (12 layers, D = 46,080), built from their configs (random
init, seed 0, nothing downloaded), wrapped with ``gradscope.wrap``, beside the same architectures at
the tests' tiny sizes (2 layers, width 16/32). Per model, in a subprocess each: ``dynamics`` with
defaults (8 probe sequences of 32 tokens), ``--parts flow`` on 256-token sequences (estimated matrix-free
at real size), ``--parts lyapunov`` over 1,000 steps (one trajectory), and ``gradscope stability DIR --model
hf --length 32 --triplets 64`` on the model saved with save_pretrained (bench/stability_realsize.py). Items that pass ``--timeout`` are killed and
printed as such. The machine's load (``os.getloadavg``) is printed beside each figure: the machine is
shared, so relative figures from one run are fairer than absolute ones.

Columns: "est. s" the plan's estimate of the work (seconds at one thread on an idle machine); "wall s"
the work itself (not imports, model building or wrapping); "CPU s" the child process's user + system
time, everything included (imports ~3 s, a real-size model's build and wrap-time check much more): on
a loaded machine CPU time, not wall time, is what the estimate predicts.

``--calibrate`` prints the primitive rates the cost model's constants came from
(gradscope/workflows/dynamics_cost.py), measured here with one torch thread.

Threads: --threads (default 1, as the cost model's constants).
Duration: samples ~10 min (14 runs, each <= ~60 s by construction); realsize up to 12 × --timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STABILITY_TRIPLETS = 64  # --triplets of the stability item (per condition; 4 conditions)
HYBRIDS = {"qwen3next": "125m", "bamba": "130m", "nemotronh": "130m", "falconh1": "130m"}  # kind → real size


def _child_sample(directory: str) -> dict:
    import torch

    from gradscope.store.io import write_store
    from gradscope.workflows.dynamics import DynamicsOptions, core_shape, plan_bytes, run_checkpoint_dynamics
    from gradscope.workflows.dynamics_cost import PROCESS_BYTES

    plans = []
    start = time.perf_counter()
    run = run_checkpoint_dynamics([Path(directory)], DynamicsOptions(), on_plan=plans.append)
    per_part = _per_part(run.plan)
    with tempfile.TemporaryDirectory() as tmp:
        write_store(run.to_xarray(), Path(tmp) / "d.zarr")
    wall = time.perf_counter() - start
    plan = plans[0]
    from gradscope.workflows.common import expand_checkpoints, load_source
    loaded = load_source(expand_checkpoints([Path(directory)])[0])
    core = loaded.model.core
    width = loaded.model.core_inputs(torch.zeros(1, 1, dtype=torch.long)).shape[-1]
    o = plan.options
    n, T = len(run.probes.conditions), run.token_class.shape[1]
    est_bytes = plan_bytes(plan, n, T, core_shape(core, width)) + PROCESS_BYTES
    return {"estimate_s": sum(plan.seconds.values()) * plan.checkpoints, "wall_s": wall, "estimate_bytes": est_bytes,
            "per_part": per_part, "rates": next((x for x in plan.lines if "estimated at " in x), "").split("estimated at ")[-1].split("; budget")[0],
            "parts": ",".join(o.parts), "options": f"seq {o.sequences} grid {o.grid_sequences} traj {o.trajectories} "
                                                   f"steps {o.steps} k {plan.exponents}"}


def _per_part(plan) -> str:  # noqa: ANN001 - a DynamicsPlan after its run
    """Each part's estimated / measured seconds on the first checkpoint (the plan's ``measured``)."""
    return ", ".join(f"{p} {plan.seconds.get(p, 0):.1f}/{s:.1f}" for p, s in plan.measured.items())


def build(kind: str, size: str):  # noqa: ANN201 - a transformers model
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "mamba2":  # mamba2-130m's configuration (issue #48): D = 4,847,616
        big = dict(hidden_size=768, num_hidden_layers=24, vocab_size=50288, num_heads=24)
        tiny = dict(hidden_size=16, num_hidden_layers=2, vocab_size=64, num_heads=2)
        cfg = transformers.Mamba2Config(**(big if size == "real" else tiny), state_size=128 if size == "real" else 8,
                                        head_dim=64 if size == "real" else 16, expand=2, n_groups=1, conv_kernel=4)
        return transformers.Mamba2ForCausalLM(cfg).eval()
    if kind in HYBRIDS:  # issue #49: the hybrids of bench/stability_realsize.py's CONFIGS
        sys.path.insert(0, str(ROOT / "bench"))
        from stability_realsize import CONFIGS, MODELS

        cls, kwargs = CONFIGS[f"{kind}-{HYBRIDS[kind] if size == 'real' else 'tiny'}"]
        return getattr(transformers, MODELS[cls])(getattr(transformers, cls)(**kwargs)).eval()
    if kind == "mamba":
        big = dict(hidden_size=768, num_hidden_layers=24, vocab_size=50280)
        tiny = dict(hidden_size=16, num_hidden_layers=2, vocab_size=64)
        cfg = transformers.MambaConfig(**(big if size == "real" else tiny), state_size=16, expand=2, conv_kernel=4)
        return transformers.MambaForCausalLM(cfg).eval()
    big = dict(hidden_size=768, num_hidden_layers=12, vocab_size=50277, attention_hidden_size=768, intermediate_size=3072)
    tiny = dict(hidden_size=32, num_hidden_layers=2, vocab_size=64, attention_hidden_size=32, intermediate_size=64)
    cfg = transformers.RwkvConfig(**(big if size == "real" else tiny))
    return transformers.RwkvForCausalLM(cfg).eval()


def _child_realsize(kind: str, size: str, item: str) -> dict:
    import torch

    import gradscope
    from gradscope.workflows.dynamics import DynamicsOptions, run_model_dynamics

    torch.manual_seed(0)
    model = gradscope.wrap(build(kind, size))
    vocab = model.inputs.num_embeddings
    gen = torch.Generator().manual_seed(0)
    plans = []
    start = time.perf_counter()
    if item == "defaults":
        tokens = torch.randint(0, vocab, (8, 32), generator=gen)
        run = run_model_dynamics(model, tokens, DynamicsOptions(), on_plan=plans.append)
    elif item == "flow256":
        tokens = torch.randint(0, vocab, (1, 256), generator=gen)
        run = run_model_dynamics(model, tokens, DynamicsOptions(parts="flow", budget_seconds=3600), on_plan=plans.append)
    elif item == "lyapunov1000":
        tokens = torch.randint(0, vocab, (1, 4), generator=gen)
        traj = torch.randint(0, vocab, (1, 1000), generator=gen)
        run = run_model_dynamics(model, tokens, DynamicsOptions(parts="lyapunov", budget_seconds=3600),
                                 trajectory_tokens=traj, on_plan=plans.append)
    else:
        return {"skipped": f"unknown item {item}"}
    wall = time.perf_counter() - start
    plan = plans[0] if plans else None
    return {"wall_s": wall, "estimate_s": sum(plan.seconds.values()) if plan else float("nan"),
            "parts": ",".join(plan.options.parts) if plan else item, "D": model.core.state_dim,
            "per_part": _per_part(run.plan)}


def child(args: list[str]) -> None:
    import torch

    torch.set_num_threads(int(os.environ.get("REALSIZE_THREADS", "1")))
    try:
        out = _child_sample(args[1]) if args[0] == "sample" else _child_realsize(*args[1:])
    except Exception as err:  # noqa: BLE001 - reported in the table, not raised
        out = {"error": f"{type(err).__name__}: {str(err)[:200]}"}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["maxrss_bytes"] = usage.ru_maxrss * 1024
    out["cpu_s"] = usage.ru_utime + usage.ru_stime  # the whole process, imports and loading included
    print("RESULT " + json.dumps(out))


def spawn(args: list[str], timeout: float, threads: int) -> dict:
    env = {**os.environ, "REALSIZE_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"killed after {timeout:g} s", "load": load, "outer_s": time.perf_counter() - start}
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    out = json.loads(lines[-1][7:]) if lines else {"error": proc.stderr.strip().splitlines()[-1][:200]}
    out["load"] = load
    return out


def stability_item(kind: str, size: str, timeout: float, triplets: int, extra: tuple[str, ...] = ()) -> dict:
    """``gradscope stability DIR --model hf --token-counts C --length 32 --triplets N`` in a subprocess
    (:func:`stability_realsize.measure_stability`), as a row of table 2."""
    sys.path.insert(0, str(ROOT / "bench"))
    from stability_realsize import measure_stability

    name = {"mamba": "mamba-130m", "mamba2": "mamba2-130m", "rwkv": "rwkv-169m",
            **{k: f"{k}-{v}" for k, v in HYBRIDS.items()}}[kind] \
        if size == "real" else f"{kind}-tiny"
    with tempfile.TemporaryDirectory() as tmp:
        r = measure_stability(name, Path(tmp), triplets=triplets, timeout=timeout, extra=extra)  # no extra: as a user runs it
    if r["rc"] != 0:
        return {"error": f"exit {r['rc']}: {' '.join(r['tail'].split())[-200:]}", "load": r["load"][0], "maxrss_bytes": r["peak_gb"] * 1e9}
    return {"wall_s": r["seconds"], "estimate_s": r["estimate_s"], "parts": f"stability ×{triplets}: {r['plan'][11:90]}",
            "D": r["D"], "cpu_s": r["cpu_s"], "maxrss_bytes": r["peak_gb"] * 1e9, "load": r["load"][0]}


def gb(x: float) -> str:
    return f"{x / 2**30:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", default="all", help="comma-separated sample names, all, or none")
    parser.add_argument("--realsize", action="store_true", help="also the real-size library models (table 2)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before an item is killed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sizes", default="tiny,real", help="table 2's sizes: tiny, real or both")
    parser.add_argument("--kinds", default="mamba,rwkv", help="table 2's models: mamba, rwkv, mamba2, qwen3next, bamba, "
                                                                 "nemotronh, falconh1")
    parser.add_argument("--triplets", type=int, default=STABILITY_TRIPLETS, help="--triplets of the stability item")
    parser.add_argument("--items", default="defaults,flow256,lyapunov1000,stability", help="table 2's items")
    parser.add_argument("--stability-args", default="", help="further options of the stability item, e.g. "
                                                             "'--checkpoint-budget-seconds 3600 --sketch-units 4' (default: none)")
    parser.add_argument("--calibrate", action="store_true", help="print the cost model's primitive rates")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    from gradscope.rates import machine_key
    print(f"# bench/realsize.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"{args.threads} torch thread(s); CPU: {machine_key(args.threads).split(' | ')[0]}; "
          f"GRADSCOPE_RATES={os.environ.get('GRADSCOPE_RATES', '(measured)')}")
    if args.calibrate:
        calibrate()
    if args.samples != "none":
        names = sorted(p.name for p in (ROOT / "sample_checkpoints").iterdir() if p.is_dir()) \
            if args.samples == "all" else args.samples.split(",")
        print("\n| sample | plan | est. s | wall s | CPU s | est. / wall | est. GB | peak GB | load | per part, 1st "
              "checkpoint: est./measured s | rates |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for name in names:
            r = spawn(["sample", str(ROOT / "sample_checkpoints" / name)], args.timeout, args.threads)
            if "error" in r:
                print(f"| {name} | {r['error']} | | | | | | {r['load']:.1f} |", flush=True)
                continue
            print(f"| {name} | {r['parts']}; {r['options']} | {r['estimate_s']:.1f} | {r['wall_s']:.1f} | "
                  f"{r['cpu_s']:.1f} | {r['estimate_s'] / r['wall_s']:.2f} | {gb(r['estimate_bytes'])} | "
                  f"{gb(r['maxrss_bytes'])} | {r['load']:.1f} | {r['per_part']} | {r['rates']} |", flush=True)
    if args.realsize:
        print("\n| model | size | D | item | plan parts | est. s | wall s | est. / wall | CPU s | peak GB | load | "
              "per part: est./measured s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for kind in args.kinds.split(","):
            for size in args.sizes.split(","):
                for item in args.items.split(","):
                    if item == "stability":  # the CLI on a save_pretrained directory (bench/stability_realsize.py)
                        r = stability_item(kind, size, args.timeout, args.triplets, tuple(args.stability_args.split()))
                    else:
                        r = spawn(["realsize", kind, size, item], args.timeout, args.threads)
                    if "error" in r or "skipped" in r:
                        print(f"| {kind} | {size} | | {item} | {r.get('error') or r.get('skipped')} | | | | "
                              f"{gb(r.get('maxrss_bytes', 0))} | {r['load']:.1f} |", flush=True)
                        continue
                    print(f"| {kind} | {size} | {r['D']:,} | {item} | {r['parts']} | {r['estimate_s']:.1f} | "
                          f"{r['wall_s']:.1f} | {r['estimate_s'] / r['wall_s']:.2f} | {r['cpu_s']:.1f} | "
                          f"{gb(r['maxrss_bytes'])} | {r['load']:.1f} | {r.get('per_part', '')} |", flush=True)


def calibrate() -> None:
    """The primitive rates behind gradscope/workflows/dynamics_cost.py, one thread."""
    import torch

    from gradscope.rates import best_seconds

    def best(fn) -> float:  # noqa: ANN001 - the shortest of 3 timings after a warm-up call
        return best_seconds(fn, 3)

    print("\n| d | matmul f32 GFLOP/s | eigvals s/d³ | svdvals s/d³ | eigvalsh s/d³ | QR f64 s/d³ |")
    print("|---|---|---|---|---|---|")
    for d in (64, 128, 256, 512):
        a = torch.randn(16, d, d)
        a64 = a.double()
        mm = best(lambda: a @ a)
        ev, sv = best(lambda: torch.linalg.eigvals(a)), best(lambda: torch.linalg.svdvals(a))
        eh, qr = best(lambda: torch.linalg.eigvalsh(a @ a.mT)), best(lambda: torch.linalg.qr(a64))
        print(f"| {d} | {2 * 16 * d ** 3 / mm / 1e9:.0f} | {ev / 16 / d ** 3:.2e} | {sv / 16 / d ** 3:.2e} | "
              f"{eh / 16 / d ** 3:.2e} | {qr / 16 / d ** 3:.2e} |")


if __name__ == "__main__":
    main()
