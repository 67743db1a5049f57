"""The CPU experiment of Figure 5: does the vanilla GRU's stability gap open with 10× longer training?

The study's GRU pair (dual-frequency reverse, K = 64, L = 16, E = 64, H = 128, batch 128, lr 3e-3;
vanilla and sinusoidal PE) trained for 60,000 iterations with checkpoints every 5,000, for seeds 1
and 2 and then seeds 3, 4 and 5 (the pre-registered test in docs/fig5-at-scale.md).
Training outlives a session, so the runs live in this repository and resume exactly:

    python experiments/fig5_cpu.py train [SEED ...]  # start or resume seeds' pairs (default 1; nice 19, one
                                                     # thread each, two runs at a time, seed by seed)
    python experiments/fig5_cpu.py pack      # before a session ends: strip all but each run's latest checkpoint
    python experiments/fig5_cpu.py status
    python experiments/fig5_cpu.py plot OUT.png STORE...  # curves with CIs from stability stores
    python experiments/fig5_cpu.py analyse [DIR]  # every finished run's stores, the pre-registered test, the median seed
    python experiments/fig5_cpu.py stores [DIR]   # the finished runs' stores only (no result read or printed)
    python experiments/fig5_cpu.py sample 5  # ship a finished pair as sample_checkpoints/gru60k-*-s5 (the median seed)

``pack`` keeps every checkpoint for the analysis but drops the optimizer state of all except the
latest (stripped checkpoints analyse, the latest one resumes). See docs/fig5-at-scale.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gradscope.files.checkpoint import list_checkpoints
from gradscope.files.io import safe_load
from gradscope.train.samples import strip_checkpoint

ROOT = Path(__file__).resolve().parent / "fig5-cpu"
SEEDS = (1, 2, 3, 4, 5)
RUNS = {(pe, seed): ROOT / f"gru-{pe}-s{seed}" for seed in SEEDS for pe in ("none", "sinusoidal")}
GRADSCOPE = os.environ.get("GRADSCOPE", "gradscope")  # e.g. a frozen install while the source tree is edited
COMMON = ["--preset", "tiny", "--core", "gru", "--embed-size", "64", "--hidden-size", "128", "--vocab-size", "64", "--length", "16",
          "--distribution", "dual", "--rarity", "0.125", "--heldout-size", "1024", "--grid-per-cell", "16",
          "--iterations", "60000", "--batch-size", "128", "--lr", "0.003", "--warmup", "200",
          "--checkpoint-every", "5000", "--log-every", "100", "--threads", "1", "-q"]


def train(*seeds: int, jobs: int = 2) -> None:
    """Start or resume every unfinished run of ``seeds`` (in order), ``jobs`` at a time, each at nice 19 with
    one torch thread; a run with a config resumes exactly from its latest checkpoint."""
    import time

    queue = [(pe, s, run) for s in (seeds or (1,)) for (pe, s2), run in RUNS.items()
             if s2 == s and not (run / "eval.json").exists()]
    running: list[subprocess.Popen] = []
    failed = 0
    while queue or running:
        while queue and len(running) < jobs:
            pe, seed, run = queue.pop(0)
            args = ["--resume", str(run), "-q"] if (run / "config.json").exists() else \
                [*COMMON, "--seed", str(seed), "--pe", pe, "-o", str(run)]
            running.append(subprocess.Popen(["nice", "-n", "19", GRADSCOPE, "train", *args]))
        time.sleep(5)
        for proc in [p for p in running if p.poll() is not None]:
            running.remove(proc)
            failed = failed or proc.returncode
    sys.exit(failed)


def pack() -> None:
    for run in RUNS.values():
        found = list_checkpoints(run) if run.is_dir() else []
        finished = (run / "eval.json").exists()  # a finished run resumes no more: strip its latest too
        for ckpt in found if finished else found[:-1]:
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


def sample(seed: int = 1) -> None:
    """Ship a finished pair as sample_checkpoints/gru60k-<pe>-s<seed>: its stripped checkpoints at
    every quarter of the run (as the other samples: 15k, 30k, 45k, 60k), its config, log and
    held-out evaluation, each listed with its sha256 in MANIFEST.json (provenance: the command)."""
    import shutil

    from gradscope.files.io import sha256_file
    from gradscope.files.io import atomic_write_text

    samples = ROOT.parent.parent / "sample_checkpoints"
    manifest = json.loads((samples / "MANIFEST.json").read_text())
    for (pe, s), run in RUNS.items():
        if s != seed:
            continue
        if not (run / "eval.json").exists():
            sys.exit(f"{run.name} has not finished")
        dest = samples / f"gru60k-{pe}-s{seed}"
        dest.mkdir(exist_ok=True)
        for name in ("config.json", "metrics.jsonl", "eval.json"):
            shutil.copyfile(run / name, dest / name)
        for ckpt in list_checkpoints(run):
            if int(ckpt.stem.split("-")[1]) % 15000 == 0:
                assert safe_load(ckpt).get("stripped"), ckpt
                shutil.copyfile(ckpt, dest / ckpt.name)
        config = json.loads((run / "config.json").read_text())
        entry = {"run": dest.name, "config": config["config"], "command": config["command"],
                 "note": "trained with --checkpoint-every 5000 (resumed with gradscope train --resume); the 15k, "
                         "30k, 45k and 60k checkpoints are shipped",
                 "seed": config["config"]["train"]["seed"], "heldout": json.loads((run / "eval.json").read_text()),
                 "files": {p.name: sha256_file(p) for p in sorted(dest.iterdir())}}
        manifest["runs"] = [r for r in manifest["runs"] if r["run"] != dest.name] + [entry]
        print(dest, sorted(entry["files"]))
    atomic_write_text(samples / "MANIFEST.json", json.dumps(manifest, indent=1) + "\n")


def plot(out: str, *stores: str) -> None:
    """Same-target stability over training, a panel per condition and a row per seed, vanilla against PE: the mean
    and 95% percentile-bootstrap CI over triplets (as `gradscope stability` prints them), drawn
    from the given stability stores (one per run) to ``out`` (.png), and printed as a table."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from gradscope.analysis.bootstrap import bootstrap_mean
    from gradscope.store.io import attr_json, read_store

    conditions = ("rare/rare", "frequent/frequent", "frequent/rare", "rare/frequent")
    loaded = [read_store(Path(store), "stability") for store in stores]
    seeds = sorted({attr_json(ds, "train_config")["seed"] for ds in loaded})  # one row of panels per seed
    fig = make_subplots(rows=len(seeds), cols=4, shared_yaxes="all", shared_xaxes=True, horizontal_spacing=0.03,
                        vertical_spacing=0.08, subplot_titles=[f"seed {s}: target/disturbant {c}"
                                                               for s in seeds for c in conditions])
    colours = {"none": ("#d62728", "rgba(214,39,40,0.15)"), "sinusoidal": ("#1f77b4", "rgba(31,119,180,0.15)")}
    print("| run | iteration | " + " | ".join(conditions) + " |\n|---|---|" + "---|" * len(conditions))
    for ds in loaded:
        pe, seed = attr_json(ds, "model_config")["pe"], attr_json(ds, "train_config")["seed"]
        name = f"{'vanilla' if pe == 'none' else 'PE'} seed {seed}"
        iters = [int(i) for i in ds["iteration"].values]
        cond = [str(c) for c in ds["condition"].values]
        scores = ds["score_default"].sel(pair="same-target").values  # (checkpoint, triplet)
        rows = {it: [] for it in iters}
        for col, c in enumerate(conditions, start=1):
            mask = [x == c for x in cond]
            cis = [bootstrap_mean(scores[k][mask], seed=0) for k in range(len(iters))]
            for it, ci in zip(iters, cis):
                rows[it].append(f"{ci.mean:.3f} [{ci.low:.3f}, {ci.high:.3f}]")
            line, band = colours.get(pe, ("#2ca02c", "rgba(44,160,44,0.15)"))
            fig.add_trace(go.Scatter(x=iters + iters[::-1], y=[ci.high for ci in cis] + [ci.low for ci in cis][::-1],
                                     fill="toself", fillcolor=band, line={"width": 0}, hoverinfo="skip",
                                     showlegend=False), row=seeds.index(seed) + 1, col=col)
            fig.add_trace(go.Scatter(x=iters, y=[ci.mean for ci in cis], mode="lines+markers", name=name,
                                     line={"color": line}, legendgroup=name, showlegend=col == 1),
                          row=seeds.index(seed) + 1, col=col)
        for it in iters:
            print(f"| {name} | {it} | " + " | ".join(rows[it]) + " |")
    for r in range(1, len(seeds) + 1):
        fig.update_yaxes(title_text="same-target stability", row=r, col=1)
    fig.update_xaxes(title_text="training iteration", row=len(seeds))
    fig.update_layout(width=1600, height=80 + 370 * len(seeds), template="plotly_white", margin={"t": 40, "b": 40})
    fig.write_image(out)


def analyse(stores: str = "fig5-stores", *, results: bool = True) -> None:
    """The pre-registered analysis (docs/fig5-at-scale.md) of every finished run: each run's stability store
    (every checkpoint; the command of seeds 1–2, one thread each, a store already there is kept), the
    accuracy store at 60,000, then ``gradscope summarize`` over training with the pre-registered test, and
    the median seed by G (the shipped pair's rule). Stores go to ``stores`` (outside git). ``results``
    False (the ``stores`` command): the finished runs' stores only, nothing read or printed of them, so
    that they can be made while other seeds still train without looking at any result early."""
    out = Path(stores)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    finished = {key: run for key, run in RUNS.items() if (run / "eval.json").exists()}
    for (pe, seed), run in finished.items():
        store = out / f"stab-{pe}-s{seed}.zarr"
        if not store.exists():
            subprocess.run([GRADSCOPE, "stability", str(run), "-o", str(store), "-q"], check=True, env=env)
        acc = out / f"acc-{pe}-s{seed}.zarr"
        if not acc.exists():
            subprocess.run([GRADSCOPE, "accuracy", str(run / "step-0060000.pt"), "-o", str(acc), "-q"], check=True,
                           env=env)
    if not results:
        print(f"stores of {len(finished)} finished runs in {out}")
        return
    pairs = sorted({seed for (_, seed) in finished if ("none", seed) in finished and ("sinusoidal", seed) in finished})
    print(f"seeds with both arms finished: {pairs}")
    stab = [str(out / f"stab-{pe}-s{seed}.zarr") for seed in pairs for pe in ("none", "sinusoidal")]
    summary = out / "fig5-summary.zarr"
    subprocess.run([GRADSCOPE, "summarize", *stab, "--checkpoints", "all", "--compare", "pe", "--interval", "t",
                    "-o", str(summary), "--overwrite"], check=True, env=env)
    from gradscope.store.io import read_store

    ds = read_store(summary).sel(contrast_metric="stability/same-target/rare/rare").isel(contrast=0)
    last = int(ds["test_last"])
    gaps = ds["diff_values"].sel(iteration=last).values
    seeds = [int(s) for s in ds["contrast_seed"].values]
    order = sorted(zip(gaps, seeds))
    median = order[(len(order) - 1) // 2]  # the lower median for an even count
    print(f"G per seed at {last}: " + ", ".join(f"seed {s}: {g:+.3f}" for g, s in order))
    print(f"the median seed by G (the shipped pair's rule): seed {median[1]} (G = {median[0]:+.3f})"
          + (" — not all five seeds yet" if len(order) < 5 else ""))
    print(f"outcome: {ds['verdict'].values}")
    _reported(out, pairs, last)


def _reported(out: Path, seeds: list[int], last: int) -> None:
    """The pre-registered test's "reported, deciding nothing": vanilla's rare-specific decay m(R/R) − m(F/F)
    at ``last`` and the accuracy grid's Rare/Rare cell, PE − vanilla, each across seeds with its t-interval."""
    import numpy as np
    from scipy import stats

    from gradscope.store.io import read_store

    def interval(values: list[float]) -> str:
        x = np.asarray(values)
        half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
        return (f"{x.mean():+.3f} [{x.mean() - half:+.3f}, {x.mean() + half:+.3f}] (t-test p = "
                f"{stats.ttest_1samp(x, 0).pvalue:.3f}); per seed " + ", ".join(f"{v:+.3f}" for v in x))

    def stability(pe: str, seed: int, condition: str) -> float:
        ds = read_store(out / f"stab-{pe}-s{seed}.zarr", "stability")
        k = [int(i) for i in ds["iteration"].values].index(last)
        mask = np.array([str(c) == condition for c in ds["condition"].values])
        return float(np.nanmean(ds["score_default"].sel(pair="same-target").values[k][mask]))

    def rare_rare(pe: str, seed: int) -> float:
        ds = read_store(out / f"acc-{pe}-s{seed}.zarr", "accuracy")
        cell = ds["grid_accuracy"].isel(checkpoint=0).sel(target_group="rare", disturbant_group="rare")
        return float(cell.mean("target_position"))

    if len(seeds) < 2:
        return
    for pe, name in (("none", "vanilla"), ("sinusoidal", "PE")):
        print(f"reported: {name} m(rare/rare) − m(frequent/frequent) at {last}: " + interval(
            [stability(pe, s, "rare/rare") - stability(pe, s, "frequent/frequent") for s in seeds]))
    print("reported: accuracy grid rare/rare at the last checkpoint, PE − vanilla: " + interval(
        [rare_rare("sinusoidal", s) - rare_rare("none", s) for s in seeds]))


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "status"
    if command == "train":
        train(*(int(a) for a in sys.argv[2:]))
    elif command == "sample":
        sample(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    elif command == "plot":
        plot(sys.argv[2], *sys.argv[3:])
    elif command == "analyse":
        analyse(*sys.argv[2:3])
    elif command == "stores":
        analyse(*sys.argv[2:3], results=False)
    else:
        {"pack": pack, "status": status}[command]()
