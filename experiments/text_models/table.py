"""Issue #38 part 4: the markdown tables of docs/real-text.md from the stores evaluate.sh writes.

    python experiments/text_models/table.py [ROOT]     # ROOT default runs/text_models
    python experiments/text_models/table.py --study STUDY   # reproduce --text stores: STUDY/mamba, STUDY/rwkv (STUDY/mamba2)
    python experiments/text_models/table.py --cross STUDY   # issue #49: one row per family (mamba, rwkv, mamba2, gdn, llama)

Accuracy: perplexity and token accuracy with their stored 95% bootstrap intervals over paragraphs,
overall and by frequency bin. Stability: the mean same-target and same-suffix scores with a
percentile bootstrap over triplets (10,000 resamples, ``numpy.random.default_rng(0)``), per
target/disturbant condition, as `gradscope stability` prints them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import xarray as xr

ARCHS = ("mamba", "rwkv")  # the models of the accuracy tables (evaluate.sh)
STUDY_ARCHS = ("mamba", "mamba2", "rwkv", "gdn", "llama")  # reproduce --text studies present under STUDY (#48, #49)
LABELS = {"mamba": "Mamba", "rwkv": "RWKV", "mamba2": "Mamba-2", "gdn": "Gated DeltaNet hybrid (Qwen3-Next)",
          "llama": "Llama transformer"}
BINS = ("frequent", "rare", "decile1", "decile2", "decile5", "decile9", "decile10")


def ci(v: float, lo: float, hi: float, fmt: str) -> str:
    return f"{v:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def accuracy_rows(root: Path) -> list[str]:
    stores = {a: xr.open_zarr(root / f"{a}-accuracy.zarr").isel(checkpoint=0) for a in ARCHS}
    out = ["| metric | " + " | ".join(ARCHS) + " |", "|---|" + "---|" * len(ARCHS)]
    out.append("| held-out perplexity | " + " | ".join(
        ci(float(d.perplexity), float(d.perplexity_low), float(d.perplexity_high), ".1f") for d in stores.values()) + " |")
    out.append("| token accuracy | " + " | ".join(
        ci(float(d.token_accuracy), float(d.token_accuracy_low), float(d.token_accuracy_high), ".3f")
        for d in stores.values()) + " |")
    for b in BINS:
        cells_p, cells_a = [], []
        for d in stores.values():
            s = d.sel(freq_bin=b)
            cells_p.append(ci(float(s.freq_perplexity), float(s.freq_perplexity_low), float(s.freq_perplexity_high), ".1f"))
            cells_a.append(ci(float(s.freq_accuracy), float(s.freq_accuracy_low), float(s.freq_accuracy_high), ".3f"))
        n = int(next(iter(stores.values())).sel(freq_bin=b).freq_n)
        out.append(f"| perplexity, {b} ({n:,} tokens) | " + " | ".join(cells_p) + " |")
        out.append(f"| token accuracy, {b} | " + " | ".join(cells_a) + " |")
    opts = json.loads(next(iter(stores.values())).attrs["options"])
    out.append(f"\n({opts['paragraphs_scored']} held-out paragraphs, {opts['tokens']:,} tokens; unseen bin: "
               + ", ".join(f"{a} {int(d.sel(freq_bin='unseen').freq_n)} tokens" for a, d in stores.items()) + ")")
    return out


def position_rows(root: Path) -> list[str]:
    stores = {a: xr.open_zarr(root / f"{a}-accuracy.zarr").isel(checkpoint=0) for a in ARCHS}
    first = next(iter(stores.values()))
    out = ["| positions | tokens | " + " | ".join(f"{a} perplexity" for a in ARCHS) + " |", "|---|---|" + "---|" * len(ARCHS)]
    for i in range(first.sizes["pos_bin"]):
        a, b = int(first.pos_start[i]), int(first.pos_end[i])
        cells = [ci(float(d.pos_perplexity[i]), float(d.pos_perplexity_low[i]), float(d.pos_perplexity_high[i]), ".1f")
                 for d in stores.values()]
        out.append(f"| {a}–{b} | {int(first.pos_n[i]):,} | " + " | ".join(cells) + " |")
    return out


def boot_mean(x: np.ndarray, rng: np.random.Generator, resamples: int = 10_000) -> tuple[float, float, float]:
    x = x[np.isfinite(x)]
    means = x[rng.integers(0, len(x), (resamples, len(x)))].mean(axis=1)  # (R,)
    return float(x.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def stability_rows(root: Path) -> list[str]:
    archs = [a for a in STUDY_ARCHS if (study / a / "stability.zarr").exists()]
    out = ["| model | target/disturbant | same-target | same-suffix | n |", "|---|---|---|---|---|"]
    for a in archs:
        d = xr.open_zarr(root / f"{a}-stability.zarr").isel(checkpoint=0)
        score = d.score_default.load()
        conds = [str(c) for c in d.condition.values]
        pairs = [str(p) for p in d.pair.values]
        for c in dict.fromkeys(conds):
            idx = [i for i, k in enumerate(conds) if k == c]
            rng = np.random.default_rng(0)
            cells = []
            for p in pairs:
                m, lo, hi = boot_mean(np.asarray(score.sel(pair=p).values)[idx], rng)
                cells.append(ci(m, lo, hi, ".3f"))
            out.append(f"| {a} | {c} | " + " | ".join(cells) + f" | {len(idx)} |")
    return out


def study_rows(study: Path) -> list[str]:
    """From ``gradscope reproduce --model R/ARCH --text … -o STUDY/ARCH`` (probes drawn from the text): the
    stability scores per condition and pair (bootstrap over triplets, as above), and per step class the
    median step radius and the median largest singular value of J_t, beside λ_1 (± its SE over trajectories)."""
    archs = [a for a in STUDY_ARCHS if (study / a / "stability.zarr").exists()]
    out = ["| model | target/disturbant | same-target | same-suffix | n |", "|---|---|---|---|---|"]
    for a in archs:
        d = xr.open_zarr(study / a / "stability.zarr").isel(checkpoint=0)
        score = d.score_default.load()
        conds = [str(c) for c in d.condition.values]
        for c in dict.fromkeys(conds):
            idx = [i for i, k in enumerate(conds) if k == c]
            rng = np.random.default_rng(0)
            cells = [ci(*boot_mean(np.asarray(score.sel(pair=p).values)[idx], rng), ".3f") for p in d.pair.values]
            out.append(f"| {a} | {c} | " + " | ".join(cells) + f" | {len(idx)} |")
    out += ["", "| model | step radius, frequent / rare / unseen | top singular value of J_t, frequent / rare | "
                "λ_1 ± SE (trajectories) | flow ‖∂y_T/∂z_1‖ / ‖∂y_T/∂z_T−1‖ |", "|---|---|---|---|---|"]
    for a in archs:
        d = xr.open_zarr(study / a / "dynamics.zarr").isel(checkpoint=0).load()
        if "step_radius" not in d:  # a transformer: no recurrent state, so no step spectra or exponents
            flow = d.flow_fro.values
            out.append(f"| {a} | - | - | - | {np.median(flow[:, 0] / flow[:, -2]):.2e} |")
            continue
        cls = d.token_class.values
        radius = d.step_radius.values
        top = d.step_sv.values[..., 0]
        r = " / ".join(f"{np.median(radius[cls == k]):.4f}" if (cls == k).any() else "-" for k in ("frequent", "rare", "unseen"))
        sv = " / ".join(f"{np.median(top[cls == k]):.3f}" if (cls == k).any() else "-" for k in ("frequent", "rare"))
        lam = d.lyapunov.values[:, 0]
        se = float(d.lyapunov_se_trajectories.values[0]) if "lyapunov_se_trajectories" in d else float("nan")
        flow = d.flow_fro.values
        ratio = np.median(flow[:, 0] / flow[:, -2])
        out.append(f"| {a} | {r} | {sv} | {lam.mean():.4f} ± {se:.4f} | {ratio:.2e} |")
    return out


def cross_rows(study: Path, root: Path = Path("runs/text_models")) -> list[str]:
    """Issue #49's one table: per family, its parameters, held-out perplexity overall and by the train text's
    frequent and rare halves (the accuracy store's intervals over paragraphs), and the same-target score after
    a frequent and after a rare target (bootstrap over the 64 triplets, as above)."""
    archs = [a for a in STUDY_ARCHS if (study / a / "stability.zarr").exists()]
    out = ["| model | parameters | train loss | perplexity | perplexity, frequent | perplexity, rare | "
           "same-target after frequent | same-target after rare |", "|---|---|---|---|---|---|---|---|"]
    for a in archs:
        acc = xr.open_zarr(study / a / "accuracy.zarr").isel(checkpoint=0)
        cells = [ci(float(acc.perplexity), float(acc.perplexity_low), float(acc.perplexity_high), ".1f")]
        for b in ("frequent", "rare"):
            s = acc.sel(freq_bin=b)
            cells.append(ci(float(s.freq_perplexity), float(s.freq_perplexity_low), float(s.freq_perplexity_high), ".1f"))
        d = xr.open_zarr(study / a / "stability.zarr").isel(checkpoint=0)
        score = d.score_default.load()
        conds = [str(c) for c in d.condition.values]
        for target in ("frequent", "rare"):
            idx = [i for i, k in enumerate(conds) if k.split("/")[0] == target]
            rng = np.random.default_rng(0)
            cells.append(ci(*boot_mean(np.asarray(score.sel(pair="same-target").values)[idx], rng), ".3f"))
        log = json.loads((root / a / "train_log.json").read_text())
        out.append(f"| {LABELS[a]} | {log['parameters']:,} | {log['final_loss']:.2f} | " + " | ".join(cells) + " |")
    return out


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--cross":
        print("\n".join(cross_rows(Path(sys.argv[2]))))
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--study":
        print("\n".join(study_rows(Path(sys.argv[2]))))
        return
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/text_models")
    print("\n".join(accuracy_rows(root)))
    print()
    print("\n".join(position_rows(root)))
    print()
    print("\n".join(stability_rows(root)))
    for a in ARCHS:
        log = json.loads((root / a / "train_log.json").read_text())
        print(f"{a}: {log['parameters']:,} parameters, {log['steps_done']} steps ({log['stopped_by']}), "
              f"{log['target_tokens_seen']:,} target tokens, {log['wall_seconds']} s, final loss {log['final_loss']:.3f}")


if __name__ == "__main__":
    main()
