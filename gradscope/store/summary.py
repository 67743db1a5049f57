"""Reading trials out of accuracy/stability stores, and the summary store (docs/stores.md)."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from gradscope.errors import GradscopeError, check
from gradscope.models import model_fields
from gradscope.store.io import attr_json, provenance, read_store
from gradscope.store.manifest import manifest_outputs, manifest_path
from gradscope.train.io import atomic_write_text
from gradscope.store.records import SummaryEntry, TrialRecord

CONFIG_FIELDS = {"model_config": ("core", "pe", "pe_combine", "hidden_size", "embed_size", "num_layers", "state_size"),
                 "task_config": ("vocab_size", "length", "distribution", "rarity")}


def expand_store_paths(patterns: list[str], kind: str | None = None) -> list[Path]:
    """Paths as given; patterns with wildcards (quoted, so the shell left them) are globbed; a
    sweep directory (or its sweep.json) stands for the stores of its finished points, of ``kind``
    (accuracy or stability) — required when the sweep has both."""
    check(kind in (None, "accuracy", "stability"), f"kind: got {kind!r}; valid kinds are accuracy, stability")
    out: list[Path] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            matches = sorted(glob.glob(pattern))
            check(bool(matches), f"stores: the pattern {pattern!r} matches nothing")
            out.extend(Path(m) for m in matches)
        elif manifest_path(Path(pattern)) is not None:
            out.extend(_sweep_stores(Path(pattern), kind))
        else:
            out.append(Path(pattern))
    check(bool(out), "stores: give at least one store")
    return out


def _sweep_stores(path: Path, kind: str | None) -> list[Path]:
    found = {k: manifest_outputs(path, (k,)) for k in ("accuracy", "stability")}
    if kind is None:
        present = [k for k, v in found.items() if v]
        check(len(present) < 2, f"stores: the sweep {path} has accuracy and stability stores; choose one with "
                                f"kind='accuracy' or kind='stability'")
        kind = present[0] if present else "accuracy"
    check(bool(found[kind]), f"stores: the sweep {path} has no finished {kind} stores yet")
    return found[kind]


def _fields(ds: xr.Dataset) -> dict[str, str]:
    fields = {}
    for attr, names in CONFIG_FIELDS.items():
        cfg = attr_json(ds, attr)
        cfg = model_fields(cfg) if attr == "model_config" else cfg
        fields.update({n: str(cfg[n]) for n in names if n in cfg})
    fields["task"] = str(attr_json(ds, "task_config")["name"])
    return fields


def _require(ds: xr.Dataset, path: Path, names: list[str]) -> None:
    missing = [n for n in names if n not in ds]
    check(not missing, f"store: {path} lacks the variable(s) {', '.join(missing)}; re-create it with this gradscope")


def _accuracy_trial(ds: xr.Dataset, path: Path) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    _require(ds, path, ["token_accuracy", "sequence_accuracy", "dl_distance", "sequence_correct", "sequence_scored",
                        "sequence_dl"])
    last = ds.isel(checkpoint=-1)
    correct, scored = last["sequence_correct"].values, ds["sequence_scored"].values
    metrics = {m: float(last[m]) for m in ("token_accuracy", "sequence_accuracy", "dl_distance")}
    tokens = np.concatenate([np.repeat([1.0, 0.0], [c, s - c]) for c, s in zip(correct, scored)]) \
        if scored.size else np.array([])
    units = {"token_accuracy": tokens, "sequence_accuracy": (correct == scored).astype(float),
             "dl_distance": last["sequence_dl"].values.astype(float)}
    if "grid_accuracy" in ds:
        acc, total = last["grid_accuracy"].values, ds["grid_total"].values  # (2, 2, L)
        for t, tg in enumerate(ds["target_group"].values):
            for d, dg in enumerate(ds["disturbant_group"].values):
                right = np.rint(acc[t, d] * total[t, d]).astype(int)
                metrics[f"grid/{tg}/{dg}"] = float(right.sum() / total[t, d].sum())
                units[f"grid/{tg}/{dg}"] = np.repeat([1.0, 0.0], [right.sum(), total[t, d].sum() - right.sum()])
                for b in range(ds.sizes["bin"]):
                    metrics[f"grid/{tg}/{dg}/bin{b + 1}"] = float(last["grid_bin_accuracy"].values[t, d, b])
    return metrics, units


def _stability_trial(ds: xr.Dataset, path: Path, score: str) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    name = f"score_{score}"
    _require(ds, path, [name])
    last = ds[name].isel(checkpoint=-1)  # (pair, triplet)
    conditions = ds["condition"].values
    metrics, units = {}, {}
    for pair in ds["pair"].values:
        for cond in dict.fromkeys(conditions):
            values = last.sel(pair=pair).values[conditions == cond]
            key = f"stability/{pair}/{cond}"
            metrics[key] = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
            units[key] = values
    return metrics, units


def trial_record(path: Path, score: str = "default") -> TrialRecord:
    """The trial in one store: its config fields, seed, and metrics at the last checkpoint."""
    ds = read_store(path)
    kind = ds.attrs["kind"]
    check(kind in ("accuracy", "stability"), f"stores: {path} is a {kind} store; summarize reads accuracy and "
                                             f"stability stores")
    try:
        fields, seed = _fields(ds), int(attr_json(ds, "train_config")["seed"])
    except (KeyError, ValueError) as exc:
        raise GradscopeError(f"store: {path} lacks its run configuration ({exc}); re-create it") from None
    metrics, units = _accuracy_trial(ds, path) if kind == "accuracy" else _stability_trial(ds, path, score)
    return TrialRecord(path, kind, fields, seed, metrics, units)


def summary_dataset(entries: list[SummaryEntry], by: tuple[str, ...], attrs: dict[str, Any]) -> xr.Dataset:
    groups = list(dict.fromkeys(e.group for e in entries))
    metrics = list(dict.fromkeys(e.metric for e in entries))
    trials = max(len(e.values) for e in entries)
    shape = (len(groups), len(metrics))
    table = {name: np.full(shape, np.nan) for name in ("mean", "low", "high")}
    counts = {name: np.zeros(shape, dtype=np.int64) for name in ("n", "nan")}
    values = np.full((*shape, trials), np.nan)
    seeds = np.full((len(groups), trials), -1, dtype=np.int64)
    for e in entries:
        g, m = groups.index(e.group), metrics.index(e.metric)
        for name in table:
            table[name][g, m] = getattr(e.interval, name)
        for name in counts:
            counts[name][g, m] = getattr(e.interval, name)
        values[g, m, :len(e.values)] = e.values
        seeds[g, :len(e.seeds)] = e.seeds
    data = {**{k: (("group", "metric"), v) for k, v in {**table, **counts}.items()},
            "values": (("group", "metric", "trial"), values), "seed": (("group", "trial"), seeds)}
    coords: dict[str, Any] = {"group": np.arange(len(groups)), "metric": np.asarray(metrics, dtype=object),
                              "trial": np.arange(trials),
                              "label": ("group", np.asarray([e.label for e in entries if e.metric == metrics[0]],
                                                            dtype=object))}
    for i, name in enumerate(by):
        coords[name] = ("group", np.asarray([g[i] for g in groups], dtype=object))
    return xr.Dataset(data, coords=coords, attrs=attrs)


def summary_attrs(command: str, by: tuple[str, ...], unit: str, method: str, confidence: float, resamples: int,
                  sources: list[Path], kind: str) -> dict[str, Any]:
    return provenance("summary", command, "cpu", {"by": list(by), "unit": unit, "method": method,
                                                  "confidence": confidence, "resamples": resamples,
                                                  "source_kind": kind, "sources": [str(p) for p in sources]})


def write_csv(entries: list[SummaryEntry], path: Path) -> None:
    """Tidy CSV: one row per group × metric, per-seed values in one column (seed=value;…)."""
    lines = ["group,metric,mean,low,high,n,nan,per_seed,note"]
    for e in entries:
        iv = e.interval
        per_seed = ";".join(f"{s}={v:.6g}" for s, v in zip(e.seeds, e.values))
        lines.append(",".join([f'"{e.label}"', e.metric, f"{iv.mean:.6g}", f"{iv.low:.6g}", f"{iv.high:.6g}",
                               str(iv.n), str(iv.nan), per_seed, f'"{iv.note}"']))
    if not path.parent.is_dir():
        raise GradscopeError(f"csv: directory {path.parent} does not exist")
    atomic_write_text(path, "\n".join(lines) + "\n")
