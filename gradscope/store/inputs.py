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
from gradscope.guard import as_int
from gradscope.store.io import attr_json, folder_entries, is_store, read_store, sha256_file
from gradscope.store.manifest import OUTPUTS, manifest_outputs, manifest_path
from gradscope.store.parts import config_parts
from gradscope.models import CORES, model_fields
from gradscope.models.registry import core_options
from gradscope.train.checkpoint import list_checkpoints



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


MAX_RUN_FILE = 256 << 20  # bytes of config.json, eval.json or metrics.jsonl read into memory


def _text(path: Path, what: str) -> str:
    """A run file's text: a plain file, of a size that fits memory, UTF-8."""
    if not path.is_file():
        raise GradscopeError(f"inputs: {what} {path} is not a plain file")
    try:
        size = path.stat().st_size
        if size > MAX_RUN_FILE:
            raise GradscopeError(f"inputs: {what} {path} is {size / 1e6:.0f} MB; a run file is at most "
                                 f"{MAX_RUN_FILE >> 20} MB")
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise GradscopeError(f"inputs: {what} {path} is not UTF-8 text") from None
    except OSError as exc:
        raise GradscopeError(f"inputs: cannot read {what} {path} ({exc.strerror or type(exc).__name__})") from None


def _parse(text: str) -> Any:
    """JSON, or a ValueError (a deeply nested document is one too)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _json(path: Path, what: str) -> Any:
    try:
        return _parse(_text(path, what))
    except ValueError as exc:
        if isinstance(exc, GradscopeError):
            raise
        raise GradscopeError(f"inputs: {what} {path} is not valid JSON ({str(exc)[:100]})") from None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _metrics(path: Path) -> list[dict[str, float]]:
    """metrics.jsonl: one object per logged iteration, with an integer ``iteration`` and numbers. A
    line cut short (a run still writing, or killed mid-line) is skipped; any other line that is not
    such an object is a user error. Fields that are not numbers are dropped."""
    rows = []
    for n, line in enumerate(_text(path, "metrics log").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = _parse(line)
        except ValueError:
            continue  # cut short
        if not isinstance(row, dict) or not isinstance(row.get("iteration"), int) or isinstance(row["iteration"], bool):
            raise GradscopeError(f"inputs: {path} line {n}: {line[:60]!r}; expected an object with an integer "
                                 f"'iteration' and numbers")
        rows.append({k: v for k, v in row.items() if _number(v)})
    return rows


def _evaluation(path: Path) -> dict[str, Any]:
    """eval.json: an object with an integer ``iteration`` and, per held-out set, an object of numbers."""
    doc = _json(path, "evaluation")
    bad = not isinstance(doc, dict) or not isinstance(doc.get("iteration"), int) or isinstance(doc["iteration"], bool)
    uniform = doc.get("uniform") if isinstance(doc, dict) else None
    if not bad and uniform is not None:
        bad = not isinstance(uniform, dict) or not _number(uniform.get("token_accuracy")) \
            or not isinstance(uniform.get("n"), int) or isinstance(uniform.get("n"), bool)
    if bad:
        raise GradscopeError(f"inputs: {path} is not a gradscope evaluation (expected an object with an integer "
                             f"'iteration' and 'uniform': {{n, token_accuracy, …}})")
    return doc


def _run_config(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(config.json, model, task, train): a gradscope run config whose parts are objects."""
    data = _json(path / "config.json", "run config")
    check(isinstance(data, dict) and data.get("format") == "gradscope-run",
          f"inputs: {path} has a config.json that is not a gradscope run config")
    cfg = data.get("config", {})
    parts = [cfg.get(k, {}) for k in ("model", "task", "train")] if isinstance(cfg, dict) else [None]
    check(all(isinstance(p, dict) for p in parts),
          f"inputs: {path}/config.json: its 'config' is not an object of model, task and train objects")
    model, task, train = parts
    if "seed" in train:
        as_int(train["seed"], f"inputs: {path}/config.json: train seed")
    return data, model, task, train


def load_run(path: Path) -> Input:
    """A run directory: config.json, metrics.jsonl (lines cut short are skipped), eval.json if present."""
    data, model, task, train = _run_config(path)
    log = path / "metrics.jsonl"
    metrics = _metrics(log) if log.exists() else []
    evaluation = _evaluation(path / "eval.json") if (path / "eval.json").exists() else None
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


def is_run(path: Path) -> bool:
    return (Path(path) / "config.json").is_file()


def expand_inputs(paths: list[Path]) -> list[Path]:
    """Each path as given, except: a sweep (directory or sweep.json) stands for its finished runs and
    stores; a folder that is neither a run nor a store stands for the runs and stores in it."""
    expanded: list[Path] = []
    for path in map(Path, paths):
        if manifest_path(path) is not None:
            found = manifest_outputs(path, OUTPUTS)
            check(bool(found), f"inputs: the sweep {path} has no finished points yet")
        elif path.is_dir() and not is_run(path) and not is_store(path):
            found = [p for p in folder_entries(path) if is_run(p) or is_store(p)]
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
        out.extend([load_run(path)] if is_run(path) else load_store(path))
    label_inputs(out)
    return out


def _config_key(item: Input) -> str:
    train = {k: v for k, v in item.train.items() if k not in NOT_CONFIG}
    return json.dumps([item.model, item.task, train], sort_keys=True)


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


# Task fields added after stores were first written: the empty default and a missing field are the same
# configuration (a store of an older gradscope has neither)
LATER_TASK_FIELDS = {"corpus": "", "corpus_sha256": ""}


def _flat(model: dict[str, Any], task: dict[str, Any], train: dict[str, Any]) -> dict[str, Any]:
    task = {k: v for k, v in task.items() if not (k in LATER_TASK_FIELDS and v == LATER_TASK_FIELDS[k])}
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
