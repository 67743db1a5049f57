"""Coverage of the stability sketch's 95% intervals (issue #47): how often value ± t_{U−1, 0.975} · se holds
the exact value, over every pair (triplet × same-target/same-suffix) of 64 triplets per condition on the
shipped GRU, LSTM and S4D samples (512 pairs each, 1,536 in all), for the sketch's fewest units (4, what a
real-size model under its default budget gets) and its most (16). The exact values come from the same
probes (same seed). Coverage is not a timing: it may run beside other work. Prints one table:

    python bench/sketch_coverage.py [--seeds 2]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import gradscope
from gradscope.analysis.sketch import interval_factor

ROOT = Path(__file__).resolve().parents[1] / "sample_checkpoints"
CORES = {"GRU": "gru-none-s1", "LSTM": "lstm-none-s1", "S4D": "s4d-none-s1"}
SCORES = ("score_default", "score_frobenius", "score_l1")


def coverage(sample: str, units: int, seed: int) -> dict[str, tuple[int, int]]:
    ckpt = ROOT / sample / "step-0006000.pt"
    exact = gradscope.stability(str(ckpt), triplets=64, estimator="exact", seed=seed)
    sketch = gradscope.stability(str(ckpt), triplets=64, estimator="sketch", sketch_units=units, seed=seed)
    factor = interval_factor(units)
    out = {}
    for name in SCORES:
        truth = exact[name].values.ravel()
        value, se = sketch[name].values.ravel(), sketch[f"se_{name}"].values.ravel()
        ok = np.isfinite(truth) & np.isfinite(value) & np.isfinite(se)
        hit = np.abs(value - truth)[ok] <= factor * se[ok]
        out[name] = (int(hit.sum()), int(ok.sum()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=1, help="probe/sketch seeds per core (512 pairs each)")
    args = parser.parse_args()
    from gradscope.guard import use_free_cores

    use_free_cores()  # as the commands do: a second thread on a busy core slows small products many times over
    print("| units | core | " + " | ".join(SCORES) + " |\n|---|---|" + "---|" * len(SCORES))
    for units in (4, 16):
        totals = {name: [0, 0] for name in SCORES}
        for label, sample in CORES.items():
            per = {name: [0, 0] for name in SCORES}
            for seed in range(args.seeds):
                for name, (hit, n) in coverage(sample, units, seed).items():
                    per[name][0] += hit
                    per[name][1] += n
            for name in SCORES:
                totals[name][0] += per[name][0]
                totals[name][1] += per[name][1]
            print(f"| {units} | {label} | " + " | ".join(f"{h / n:.3f} ({n})" for h, n in per.values()) + " |")
        print(f"| {units} | all | " + " | ".join(f"**{h / n:.3f}** ({n})" for h, n in totals.values()) + " |")


if __name__ == "__main__":
    main()
