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

from gradscope.analysis.bootstrap import Interval, bootstrap_mean, confidence_interval
from gradscope.fields import BAND, BANDS, CONFIDENCE, DEFAULT_SCORE, RESAMPLES
from gradscope.errors import check
from gradscope.files.io import sha256_file
from gradscope.store.io import attr_json, folder_entries, is_store, read_store
from gradscope.store.manifest import OUTPUTS, manifest_outputs, manifest_path
from gradscope.store.parts import config_parts
from gradscope.models import CORES, model_fields
from gradscope.models.registry import core_options
from gradscope.files.checkpoint import list_checkpoints
from gradscope.files.rundir import is_run_dir, read_config_parts, read_evaluation, read_metrics



def core_label(core: str) -> str:
    """How reports write a core: its registered class's label (the name itself if unregistered)."""
    return CORES[core].label if core in CORES else core
NOT_CONFIG = ("seed", "device", "threads")  # train fields that do not make a different configuration
# how labels write shared config fields; a core's own settings name theirs (CoreOption.short)
SHORT = {"vocab_size": "K", "length": "L", "hidden_size": "H", "embed_size": "E", "num_layers": "layers"}


def strings(da: xr.DataArray) -> np.ndarray:
    """A string coordinate as a numpy array of str (zarr may return numpy's StringDType)."""
    return np.array([str(v) for v in np.asarray(da.values).ravel()], dtype=object)


def field_name(name: str) -> str:
    """Short name of a config field in labels (vocab_size → K)."""
    if name in SHORT:
        return SHORT[name]
    option = core_options().get(name)
    return option.short if option is not None and option.short else name


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
    label: str = ""  # the configuration's short label (set by label_inputs)
    detail: str = ""  # the configuration's full label: every field that differs from the other inputs

    @property
    def seed(self) -> int | None:
        return self.train.get("seed")


def load_run(path: Path) -> Input:
    """A run directory (read by :mod:`gradscope.files.rundir`): config.json, metrics.jsonl (lines
    cut short are skipped), eval.json if present."""
    data, model, task, train = read_config_parts(path, "inputs")
    metrics = read_metrics(path, "inputs")
    evaluation = read_evaluation(path, "inputs")
    files = [p for p in list_checkpoints(path) if p.is_file()]
    checkpoints = [{"path": str(p), "iteration": int(p.stem.split("-")[-1]) if p.stem.startswith("step-") else None,
                    "sha256": sha256_file(p) if p == files[-1] else ""} for p in files]
    meta = {"gradscope_version": str(data.get("gradscope_version", "")), "command": str(data.get("command", "")),
            "checkpoints": checkpoints}
    return Input(path, "run", model_fields(model), task, train, None, metrics, evaluation, meta)


def load_store(path: Path) -> list[Input]:
    """A gradscope store of any kind, with its configs and provenance decoded: one input per
    configuration of its checkpoints (``store/parts.py``; one for a store of one configuration)."""
    ds = read_store(path)
    kind = ds.attrs["kind"]
    meta = {k: ds.attrs.get(k, "") for k in ("gradscope_version", "torch_version", "device", "host", "command",
                                             "created")}
    out = []
    for part in config_parts(ds):
        decoded = {k: attr_json(part, k) if k in part.attrs else {} for k in ("model_config", "task_config",
                                                                              "train_config")}
        checkpoints = attr_json(part, "checkpoints") if "checkpoints" in part.attrs else []
        out.append(Input(path, kind, model_fields(decoded["model_config"]), decoded["task_config"],
                         decoded["train_config"], part, meta={**meta, "checkpoints": checkpoints}))
    return out


def expand_inputs(paths: list[Path]) -> list[Path]:
    """Each path as given, except: a sweep (directory or sweep.json) stands for its finished runs and
    stores; a folder that is neither a run nor a store stands for the runs and stores in it."""
    expanded: list[Path] = []
    for path in map(Path, paths):
        if manifest_path(path) is not None:
            found = manifest_outputs(path, OUTPUTS)
            check(bool(found), f"inputs: the sweep {path} has no finished points yet")
        elif path.is_dir() and not is_run_dir(path) and not is_store(path):
            found = [p for p in folder_entries(path) if is_run_dir(p) or is_store(p)]
            check(bool(found), f"inputs: {path} is neither a run directory nor a store, and holds none")
        else:
            found = [path]
        expanded.extend(found)
    return expanded


def load_inputs(paths: list[Path]) -> list[Input]:
    """Stores and run directories (or sweeps, or folders of them), checked; a user error names the
    first bad path."""
    check(bool(paths), "inputs: give at least one store (stability, accuracy, summary) or run directory")
    out = []
    for path in expand_inputs(paths):
        check(path.exists(), f"inputs: {path} does not exist")
        check(path.is_dir(), f"inputs: {path} is a file; expected a zarr store or a run directory")
        out.extend([load_run(path)] if is_run_dir(path) else load_store(path))
    label_inputs(out)
    return out


# Fields added after stores were first written, with the value a store without them had: a
# configuration without the field and one with this value are the same configuration.
ADDED_DEFAULTS = {"model": {"inputs": "tokens", "feedback": False}, "train": {"decoding": "none"},
                  "task": {"dim": 0, "old_items": 0, "new_item_share": None, "corpus": "",
                           "corpus_sha256": ""}}


def _filled(section: str, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the fields of :data:`ADDED_DEFAULTS` it lacks (a gradscope config only)."""
    if section == "model" and "core" not in config or section != "model" and not config:
        return config  # a wrapped model's description, or nothing recorded
    return {**ADDED_DEFAULTS[section], **config}


def _config_key(item: Input) -> str:
    train = {k: v for k, v in _filled("train", item.train).items() if k not in NOT_CONFIG}
    return json.dumps([_filled("model", item.model), _filled("task", item.task), train], sort_keys=True)


# Fields that make a different configuration but not one a reader compares: never in a short label.
BOOKKEEPING = ("checkpoint_every", "log_every", "heldout_size", "grid_per_cell", "hold_min", "hold_max", "max_len")
# Fields a short label names first, in this order; any other differing field comes after them.
# (the registered cores' own settings follow them, in registry order)
LABEL_ORDER = ("iterations", "vocab_size", "length", "distribution", "rarity", "hidden_size", "embed_size",
               "num_layers", "lr", "batch_size", "pe_combine")
MAX_LABEL_FIELDS = 2  # differing fields named in a short label (more only when needed to tell labels apart)


def _value_text(name: str, value: Any) -> str:
    """One differing field as a short label writes it: '60k it', 'K=64', 'dual'."""
    if name == "iterations" and isinstance(value, int):
        return f"{value // 1000}k it" if value >= 1000 and value % 1000 == 0 else f"{value} it"
    if name == "distribution":
        return str(value)
    return f"{field_name(name)}={value}"


def _flat(model: dict[str, Any], task: dict[str, Any], train: dict[str, Any]) -> dict[str, Any]:
    model, task, train = _filled("model", model), _filled("task", task), _filled("train", train)
    return {**{f"model.{k}": v for k, v in model.items()}, **{f"task.{k}": v for k, v in task.items()},
            **{f"train.{k}": v for k, v in train.items() if k not in NOT_CONFIG}}


def _rank(key: str) -> tuple[int, int, str]:
    name = key.split(".", 1)[1]
    if name in BOOKKEEPING:
        return (2, BOOKKEEPING.index(name), key)
    order = (*LABEL_ORDER, *core_options())
    return (0, order.index(name), key) if name in order else (1, 0, key)


def config_labels(configs: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]
                  ) -> list[tuple[str, str]]:
    """(short label, full label) for each (model, task, train) configuration, the one label function
    of reports.

    Short: core and PE ('GRU vanilla', 'LSTM PE (sinusoidal)'), then — among configurations that share
    core and PE — the one or two fields that differ, most telling first and bookkeeping
    (``BOOKKEEPING``) only when nothing else tells them apart: 'GRU vanilla · 60k it'. Full: core and
    PE with every differing field, for hover text and the provenance table.
    """
    bases = [model_label(model) for model, _, _ in configs]
    flats = [_flat(*c) for c in configs]
    out: list[tuple[str, str]] = [("", "")] * len(configs)
    for base in dict.fromkeys(bases):
        idx = [n for n, b in enumerate(bases) if b == base]
        keys = {json.dumps(flats[n], sort_keys=True) for n in idx}
        differ = sorted({k for n in idx for k in flats[n]
                         if len({json.dumps(flats[m].get(k)) for m in idx}) > 1}, key=_rank)
        telling = sum(_rank(k)[0] < 2 for k in differ)
        for take in range(min(MAX_LABEL_FIELDS, telling), len(differ) + 1):
            shorts = {n: ", ".join(_value_text(k.split(".", 1)[1], flats[n].get(k)) for k in differ[:take])
                      for n in idx}
            if len(set(shorts.values())) == len(keys):
                break
        for n in idx:
            full = ", ".join(f"{field_name(k.split('.', 1)[1])}={flats[n].get(k)}" for k in differ)
            out[n] = (f"{base} · {shorts[n]}" if differ else base, f"{base} [{full}]" if differ else base)
    return out


def label_inputs(items: list[Input]) -> None:
    """Set each input's ``label`` (short) and ``detail`` (full) from :func:`config_labels`."""
    keyed = [i for i in items if i.kind != "summary"]
    configs = {_config_key(i): i for i in keyed}
    names = dict(zip(configs, config_labels([(i.model, i.task, i.train) for i in configs.values()])))
    for item in keyed:
        item.label, item.detail = names[_config_key(item)]


def configurations(items: list[Input]) -> dict[str, list[Input]]:
    """Inputs grouped by label (configuration), in first-seen order."""
    out: dict[str, list[Input]] = {}
    for item in items:
        out.setdefault(item.label, []).append(item)
    return out


# --- stability aggregates -----------------------------------------------------------------------

@dataclass(frozen=True)
class StabilityPoint:
    """Mean score and CI of one configuration × pair × condition at one iteration. ``unit``: what the
    interval is over — ``triplet`` (every triplet of the configuration's stores pooled: one seed, or
    ``band="triplets"``) or ``seed`` (the seeds' mean scores, a Student t-interval); ``per_seed``: each
    store's (seed, mean score over its triplets) there."""

    label: str
    pair: str
    condition: str
    iteration: int
    interval: Interval
    stores: int  # stores (seeds) that contributed
    unit: str = "triplet"
    per_seed: tuple[tuple[int, float], ...] = ()


def _score(ds: xr.Dataset, score: str, path: Path) -> xr.DataArray:
    name = f"score_{score}"
    valid = sorted(k[6:] for k in ds.data_vars if str(k).startswith("score_"))
    check(name in ds, f"score: got {score!r}; {path} holds {', '.join(valid)}")
    return ds[name]


def stability_curves(stores: list[Input], score: str = DEFAULT_SCORE, resamples: int = RESAMPLES,
                     seed: int = 0, band: str = BAND, confidence: float = CONFIDENCE) -> list[StabilityPoint]:
    """Per configuration, pair, condition and iteration: the mean score and its CI. A configuration with
    stores of two or more seeds there and ``band="seeds"``: the mean of the seeds' mean scores and the
    Student t-interval over seeds (seeds are the trials); otherwise the mean over the triplets of every
    store of that configuration that has the iteration, with a percentile-bootstrap CI over them; both intervals at
    ``confidence`` (95% by default)."""
    check(band in BANDS, f"band: got {band!r}; valid values are {', '.join(BANDS)}")
    points = []
    for label, members in configurations(stores).items():
        arrays = [(_score(m.ds, score, m.path), m.ds, m.seed) for m in members]
        iterations = sorted({int(i) for _, ds, _ in arrays for i in ds["iteration"].values})
        conditions = list(dict.fromkeys(str(c) for _, ds, _ in arrays for c in ds["condition"].values))
        pairs = list(dict.fromkeys(str(p) for _, ds, _ in arrays for p in ds["pair"].values))
        for pair in pairs:
            for cond in conditions:
                for it in iterations:
                    values, seeds = [], []
                    for da, ds, member_seed in arrays:
                        at = np.flatnonzero(ds["iteration"].values == it)
                        mask = strings(ds["condition"]) == cond
                        if at.size and mask.any():
                            values.append(da.isel(checkpoint=int(at[-1])).sel(pair=pair).values[mask])
                            seeds.append(-1 if member_seed is None else int(member_seed))
                    if not values:
                        continue
                    means = [float(np.nanmean(v)) if np.isfinite(v).any() else float("nan") for v in values]
                    per_seed = tuple(zip(seeds, means))
                    if band == "seeds" and len(set(seeds)) >= 2:
                        iv = confidence_interval(np.array(means), method="t", confidence=confidence)
                        points.append(StabilityPoint(label, pair, cond, it, iv, len(values), "seed", per_seed))
                    else:
                        iv = bootstrap_mean(np.concatenate(values), confidence=confidence, resamples=resamples, seed=seed)
                        points.append(StabilityPoint(label, pair, cond, it, iv, len(values), "triplet", per_seed))
    return points


def at_iteration(ds: xr.Dataset, iteration: int | None, path: Path) -> int:
    """Checkpoint index of ``iteration`` in a store (None: the last checkpoint)."""
    its = [int(i) for i in ds["iteration"].values]
    if iteration is None:
        return len(its) - 1
    check(iteration in its, f"iteration: got {iteration}; {path} has iterations {', '.join(map(str, its))}")
    return its.index(iteration)


def stability_samples(stores: list[Input], score: str = DEFAULT_SCORE,
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
