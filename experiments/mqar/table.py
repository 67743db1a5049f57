"""The mqar table of docs/mqar.md from the summary stores that experiments/mqar/run.sh writes.

Usage: python experiments/mqar/table.py [OUT]   (default OUT: runs/mqar)
Rows: token accuracy, recall after frequent and after rare keys, and recall by pair–query distance;
columns: core × PE; cells: mean [95% CI] over the 3 seeds (Student t) and, below, pooled over the
held-out queries of the 3 seeds (percentile bootstrap).
"""

from __future__ import annotations

import sys
from pathlib import Path

from gradscope.store import read_store


def cells(path: Path) -> tuple[list[str], dict[str, dict[str, str]]]:
    ds = read_store(path)
    groups = [f"{m.upper() if m == 'gru' else m.capitalize()} {'vanilla' if p == 'none' else 'PE'}"
              for m, p in zip(ds["core"].values, ds["pe"].values)]
    table: dict[str, dict[str, str]] = {}
    for metric in ds["metric"].values:
        row = ds.sel(metric=metric)
        table[str(metric)] = {g: f"{float(m):.3f} [{float(lo):.3f}, {float(hi):.3f}]"
                              for g, m, lo, hi in zip(groups, row["mean"].values, row["low"].values, row["high"].values)}
    return groups, table


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/mqar")
    for unit, what in (("trial", "over 3 seeds (t)"), ("token", "pooled queries of 3 seeds (bootstrap)")):
        groups, table = cells(out / f"summary-{unit}.zarr")
        order = sorted(range(len(groups)), key=lambda i: groups[i])
        names = [groups[i] for i in order]
        print(f"\nmean [95% CI] {what}\n")
        print("| | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        rows = ["token_accuracy", "recall/frequent", "recall/rare"]
        rows += sorted((m for m in table if m.startswith("recall/") and m.count("/") == 2),
                       key=lambda m: (m.split("/")[1], int(m.split("/d")[1].split("-")[0])))
        for metric in rows:
            if metric in table:
                print(f"| {metric} | " + " | ".join(table[metric][g] for g in names) + " |")


if __name__ == "__main__":
    main()
