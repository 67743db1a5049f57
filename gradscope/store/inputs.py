"""`gradscope report`, the part without plotting: load stores and runs, label them, aggregate.

Seeds: stores (or runs) whose model, task and training configs agree apart from the seed are one
*configuration*; their triplets are pooled, so a stability CI is over all triplets of all seeds (the
probe-to-probe spread). The seed-to-seed spread is what `gradscope summarize` measures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from gradscope.analysis.bootstrap import Interval, bootstrap_mean
from gradscope.errors import GradscopeError, check
from gradscope.store.io import attr_json, read_store, sha256_file
from gradscope.store.manifest import OUTPUTS, manifest_outputs, manifest_path
from gradscope.models import CORES, model_fields
from gradscope.train.checkpoint import list_checkpoints



def core_label(core: str) -> str:
    """How reports write a core: its registered class's label (the name itself if unregistered)."""
    return CORES[core].label if core in CORES else core
NOT_CONFIG = ("seed", "device", "threads")  # train fields that do not make a different configuration
SHORT = {"vocab_size": "K", "length": "L", "hidden_size": "H", "embed_size": "E", "num_layers": "layers",
         "state_size": "N"}  # how labels write config fields


def strings(da: xr.DataArray) -> np.ndarray:
    """A string coordinate as a numpy array of str (zarr may return numpy's StringDType)."""
    return np.array([str(v) for v in np.asarray(da.values).ravel()], dtype=object)


def field_name(name: str) -> str:
    """Short name of a config field in labels (vocab_size → K)."""
    return SHORT.get(name, name)


def pe_label(pe: str) -> str:
    """'vanilla' for no positional encoding, else 'PE (<kind>)'."""
    return "vanilla" if pe in ("none", "", None) else f"PE ({pe})"


def model_label(model: dict[str, Any]) -> str:
    """e.g. 'GRU vanilla', 'LSTM PE (sinusoidal)'."""
    core = str(model.get("core", "?"))
    return f"{core_label(core)} {pe_label(str(model.get('pe', 'none')))}"


@dataclass
class Input:
    """One report input: a store (``ds``) or a run directory (``metrics``, ``evaluation``)."""

    path: Path
    kind: str  # stability | accuracy | summary | run
    model: dict[str, Any] = field(default_factory=dict)
    task: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    ds: xr.Dataset | None = None
    metrics: list[dict[str, float]] = field(default_factory=list)
    evaluation: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # versions, command, created, checkpoints
    label: str = ""  # the configuration's label (set by label_inputs)

    @property
    def seed(self) -> int | None:
        return self.train.get("seed")


def _json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise GradscopeError(f"inputs: cannot read {what} {path} ({type(exc).__name__})") from None


def load_run(path: Path) -> Input:
    """A run directory: config.json, metrics.jsonl (lines cut short are skipped), eval.json if present."""
    data = _json(path / "config.json", "run config")
    check(isinstance(data, dict) and data.get("format") == "gradscope-run",
          f"inputs: {path} has a config.json that is not a gradscope run config")
    metrics = []
    log = path / "metrics.jsonl"
    for line in (log.read_text().splitlines() if log.is_file() else []):
        try:
            metrics.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    evaluation = _json(path / "eval.json", "evaluation") if (path / "eval.json").is_file() else None
    files = list_checkpoints(path)
    checkpoints = [{"path": str(p), "iteration": int(p.stem.split("-")[-1]) if p.stem.startswith("step-") else None,
                    "sha256": sha256_file(p) if p == files[-1] else ""} for p in files]
    cfg = data.get("config", {})
    meta = {"gradscope_version": data.get("gradscope_version", ""), "command": data.get("command", ""),
            "checkpoints": checkpoints}
    return Input(path, "run", model_fields(cfg.get("model", {})), cfg.get("task", {}), cfg.get("train", {}), None, metrics,
                 evaluation, meta)


def load_store(path: Path) -> Input:
    """A gradscope store of any kind, with its configs and provenance decoded."""
    ds = read_store(path)
    kind = ds.attrs["kind"]
    decoded = {k: attr_json(ds, k) if k in ds.attrs else {} for k in ("model_config", "task_config", "train_config")}
    meta = {k: ds.attrs.get(k, "") for k in ("gradscope_version", "torch_version", "device", "host", "command",
                                             "created")}
    meta["checkpoints"] = attr_json(ds, "checkpoints") if "checkpoints" in ds.attrs else []
    return Input(path, kind, model_fields(decoded["model_config"]), decoded["task_config"], decoded["train_config"], ds, meta=meta)


def load_inputs(paths: list[Path]) -> list[Input]:
    """Stores and run directories, checked; a user error names the first bad path."""
    check(bool(paths), "inputs: give at least one store (stability, accuracy, summary) or run directory")
    expanded: list[Path] = []
    for path in map(Path, paths):  # a sweep stands for its finished runs and their stores
        sweep = manifest_outputs(path, OUTPUTS) if manifest_path(path) is not None else [path]
        check(bool(sweep), f"inputs: the sweep {path} has no finished points yet")
        expanded.extend(sweep)
    out = []
    for path in expanded:
        check(path.exists(), f"inputs: {path} does not exist")
        check(path.is_dir(), f"inputs: {path} is a file; expected a zarr store or a run directory")
        out.append(load_run(path) if (path / "config.json").is_file() else load_store(path))
    label_inputs(out)
    return out


def _config_key(item: Input) -> str:
    train = {k: v for k, v in item.train.items() if k not in NOT_CONFIG}
    return json.dumps([item.model, item.task, train], sort_keys=True)


def label_inputs(items: list[Input]) -> None:
    """Set each input's label: core and PE; where configurations share that, the fields that differ."""
    keyed = [i for i in items if i.kind != "summary"]
    configs = {_config_key(i): i for i in keyed}
    by_base: dict[str, list[Input]] = {}
    for item in configs.values():
        by_base.setdefault(model_label(item.model), []).append(item)
    names: dict[str, str] = {}
    for base, members in by_base.items():
        flat = [{**{f"model.{k}": v for k, v in m.model.items()}, **{f"task.{k}": v for k, v in m.task.items()},
                 **{f"train.{k}": v for k, v in m.train.items() if k not in NOT_CONFIG}} for m in members]
        differ = sorted({k for f in flat for k in f if len({json.dumps(g.get(k)) for g in flat}) > 1})
        for m, f in zip(members, flat):
            extra = ", ".join(f"{field_name(k.split('.', 1)[1])}={f.get(k)}" for k in differ)
            names[_config_key(m)] = f"{base} [{extra}]" if extra else base
    for item in keyed:
        item.label = names[_config_key(item)]


def configurations(items: list[Input]) -> dict[str, list[Input]]:
    """Inputs grouped by label (configuration), in first-seen order."""
    out: dict[str, list[Input]] = {}
    for item in items:
        out.setdefault(item.label, []).append(item)
    return out


# --- stability aggregates -----------------------------------------------------------------------

@dataclass(frozen=True)
class StabilityPoint:
    """Mean score and CI of one configuration × pair × condition at one iteration (seeds pooled)."""

    label: str
    pair: str
    condition: str
    iteration: int
    interval: Interval
    stores: int  # stores (seeds) that contributed


def _score(ds: xr.Dataset, score: str, path: Path) -> xr.DataArray:
    name = f"score_{score}"
    valid = sorted(k[6:] for k in ds.data_vars if str(k).startswith("score_"))
    check(name in ds, f"score: got {score!r}; {path} holds {', '.join(valid)}")
    return ds[name]


def stability_curves(stores: list[Input], score: str = "default", resamples: int = 10_000,
                     seed: int = 0) -> list[StabilityPoint]:
    """Per configuration, pair, condition and iteration: mean score and 95% percentile-bootstrap CI
    over the triplets of every store (seed) of that configuration that has the iteration."""
    points = []
    for label, members in configurations(stores).items():
        arrays = [(_score(m.ds, score, m.path), m.ds) for m in members]
        iterations = sorted({int(i) for _, ds in arrays for i in ds["iteration"].values})
        conditions = list(dict.fromkeys(str(c) for _, ds in arrays for c in ds["condition"].values))
        pairs = list(dict.fromkeys(str(p) for _, ds in arrays for p in ds["pair"].values))
        for pair in pairs:
            for cond in conditions:
                for it in iterations:
                    values = []
                    for da, ds in arrays:
                        at = np.flatnonzero(ds["iteration"].values == it)
                        mask = strings(ds["condition"]) == cond
                        if at.size and mask.any():
                            values.append(da.isel(checkpoint=int(at[-1])).sel(pair=pair).values[mask])
                    if values:
                        iv = bootstrap_mean(np.concatenate(values), resamples=resamples, seed=seed)
                        points.append(StabilityPoint(label, pair, cond, it, iv, len(values)))
    return points


def at_iteration(ds: xr.Dataset, iteration: int | None, path: Path) -> int:
    """Checkpoint index of ``iteration`` in a store (None: the last checkpoint)."""
    its = [int(i) for i in ds["iteration"].values]
    if iteration is None:
        return len(its) - 1
    check(iteration in its, f"iteration: got {iteration}; {path} has iterations {', '.join(map(str, its))}")
    return its.index(iteration)


def stability_samples(stores: list[Input], score: str = "default",
                      iteration: int | None = None) -> dict[str, dict[tuple[str, str], np.ndarray]]:
    """label → (pair, condition) → scores of all triplets (seeds pooled) at one checkpoint per store
    (``iteration``, or each store's last checkpoint)."""
    out: dict[str, dict[tuple[str, str], np.ndarray]] = {}
    for label, members in configurations(stores).items():
        acc: dict[tuple[str, str], list[np.ndarray]] = {}
        for m in members:
            da = _score(m.ds, score, m.path).isel(checkpoint=at_iteration(m.ds, iteration, m.path))
            conds = strings(m.ds["condition"])
            for pair in da["pair"].values:
                for cond in dict.fromkeys(conds):
                    acc.setdefault((str(pair), cond), []).append(da.sel(pair=pair).values[conds == cond])
        out[label] = {k: np.concatenate(v) for k, v in acc.items()}
    return out


def mean_spectra(stores: list[Input], iteration: int | None = None) -> dict[str, dict[str, tuple[np.ndarray, int]]]:
    """label → condition → (mean singular values (sv,), number of Jacobians averaged): the mean over
    members (base, same-target, same-suffix) and triplets of all seeds, at one checkpoint per store."""
    out: dict[str, dict[str, tuple[np.ndarray, int]]] = {}
    for label, members in configurations(stores).items():
        acc: dict[str, list[np.ndarray]] = {}
        for m in members:
            if "singular_values" not in m.ds:
                continue
            sv = m.ds["singular_values"].isel(checkpoint=at_iteration(m.ds, iteration, m.path))  # (member, triplet, sv)
            sv = sv.transpose("triplet", "member", "sv").values
            conds = strings(m.ds["condition"])
            for cond in dict.fromkeys(conds):
                acc.setdefault(cond, []).append(sv[conds == cond].reshape(-1, sv.shape[-1]))
        if acc:
            width = min(a.shape[-1] for v in acc.values() for a in v)
            out[label] = {c: (np.nanmean(np.concatenate([a[:, :width] for a in v]), axis=0),
                              sum(a.shape[0] for a in v)) for c, v in acc.items()}
    return out
