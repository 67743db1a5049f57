"""Reading trials out of accuracy/stability stores, and the summary store (docs/stores.md)."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from gradscope.errors import GradscopeError, check
from gradscope.fields import CHECKPOINTS, DEFAULT_SCORE, SUMMARY_CHECKPOINTS
from gradscope.fields import as_int
from gradscope.models import model_fields
from gradscope.store.accuracy import family_values
from gradscope.store.io import attr_json, folder_entries, is_store, provenance, read_store, store_kind
from gradscope.store.manifest import manifest_outputs, manifest_path
from gradscope.store.parts import config_parts
from gradscope.files.io import atomic_write
from gradscope.store.records import SummaryEntry, TrainingComparison, TrialRecord
from gradscope.models.registry import core_options
from gradscope.tasks.base import Task

# the fields a summary entry carries (the registered cores' own settings too: :func:`config_fields`)
CONFIG_FIELDS = {"model_config": ("core", "pe", "pe_combine", "hidden_size", "embed_size", "num_layers"),
                 "task_config": ("vocab_size", "length", "distribution", "rarity")}


def config_fields() -> dict[str, tuple[str, ...]]:
    """:data:`CONFIG_FIELDS` with every registered core's own settings among the model's."""
    return {**CONFIG_FIELDS, "model_config": (*CONFIG_FIELDS["model_config"], *core_options())}


SUMMARIZED = ("accuracy", "stability")  # the kinds of store summarize reads


def expand_store_paths(patterns: list[str], kind: str | None = None) -> list[Path]:
    """Paths as given; patterns with wildcards (quoted, so the shell left them) are globbed; a
    sweep directory (or its sweep.json) stands for the stores of its finished points, and a folder
    that is not a store for the accuracy and stability stores in it — of ``kind`` (accuracy or
    stability) if given, else of both kinds."""
    check(kind in (None, *SUMMARIZED), f"kind: got {kind!r}; valid kinds are accuracy, stability")
    kinds = (kind,) if kind is not None else SUMMARIZED
    out: list[Path] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            matches = sorted(glob.glob(pattern))
            check(bool(matches), f"stores: the pattern {pattern!r} matches nothing")
            out.extend(Path(m) for m in matches)
        elif manifest_path(Path(pattern)) is not None:
            found = manifest_outputs(Path(pattern), kinds)
            check(bool(found), f"stores: the sweep {pattern} has no finished {' or '.join(kinds)} stores yet")
            out.extend(found)
        elif Path(pattern).is_dir() and not is_store(Path(pattern)):
            found = [p for p in folder_entries(Path(pattern)) if is_store(p) and store_kind(p) in (*kinds, None)]
            check(bool(found), f"stores: {pattern} is not a store and holds no {' or '.join(kinds)} store")
            out.extend(found)
        else:
            out.append(Path(pattern))
    check(bool(out), "stores: give at least one store")
    return out


def store_kinds(paths: list[Path]) -> list[str]:
    """The kinds (accuracy, stability) of the stores at ``paths``, in the order first met; a store that
    is neither is refused."""
    kinds = []
    for path in paths:
        kind = store_kind(path) if is_store(path) else None
        if kind is None:
            read_store(path)  # says in one line what is wrong with it
        check(kind in SUMMARIZED, f"stores: {path} is a {kind} store; summarize reads accuracy and stability stores")
        kinds.append(kind)
    return list(dict.fromkeys(kinds))


def _config(ds: xr.Dataset, path: Path, key: str) -> dict[str, Any]:
    if key not in ds.attrs:
        raise GradscopeError(f"store: {path} lacks its run configuration ({key}); re-create it")
    return attr_json(ds, key)  # read_store checked it is a JSON object


def _fields(ds: xr.Dataset, path: Path) -> dict[str, str]:
    fields = {}
    for attr, names in config_fields().items():
        cfg = _config(ds, path, attr)
        cfg = model_fields(cfg) if attr == "model_config" else cfg
        fields.update({n: str(cfg[n]) for n in names if n in cfg})
    task = _config(ds, path, "task_config")
    if "name" not in task:
        raise GradscopeError(f"store: {path} lacks its run configuration (the task's name); re-create it")
    fields["task"] = str(task["name"])
    return fields


def _require(ds: xr.Dataset, path: Path, names: list[str]) -> None:
    missing = [n for n in names if n not in ds]
    check(not missing, f"store: {path} lacks the variable(s) {', '.join(missing)}; re-create it with this gradscope")


def _right(p: Path, what: str, ok: bool) -> None:
    if not ok:
        raise GradscopeError(f"store: {p}: {what}; re-create it")


def _accuracy_trial(ds: xr.Dataset, path: Path, at: int = -1) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Metrics at checkpoint index ``at`` (the last by default); units: 1/0 per scored token, per scored sequence (full match),
    the DL distance per sequence. Nothing scored gives NaN, never 0. A feedback model's store gives
    token accuracy per decoding; an extended vocabulary's, token accuracy on old and new target items;
    a task family's, the metrics it declares (a family whose store is its own part alone: those only)."""
    family, values = family_values(ds, at)
    if family is not None and not family.token_part:
        return _family_metrics(path, family, values)
    _require(ds, path, ["token_accuracy", "sequence_accuracy", "dl_distance", "sequence_correct", "sequence_scored",
                        "sequence_dl"])
    last = ds.isel(checkpoint=at)
    correct, scored = last["sequence_correct"].values, ds["sequence_scored"].values
    _right(path, "sequence_correct exceeds sequence_scored", bool((correct <= scored).all()))
    metrics = {m: float(last[m]) for m in ("token_accuracy", "sequence_accuracy", "dl_distance")}
    tokens = np.repeat(np.tile([1.0, 0.0], correct.size), np.column_stack([correct, scored - correct]).ravel())
    units = {"token_accuracy": tokens, "sequence_accuracy": (correct == scored)[scored > 0].astype(float),
             "dl_distance": last["sequence_dl"].values.astype(float)}
    if "grid_accuracy" in ds:
        _require(ds, path, ["grid_total", "grid_bin_accuracy"])
        acc, total = last["grid_accuracy"].values, ds["grid_total"].values  # (2, 2, L)
        for t, tg in enumerate(ds["target_group"].values):
            for d, dg in enumerate(ds["disturbant_group"].values):
                scored_at = total[t, d] > 0
                cell = acc[t, d][scored_at]
                _right(path, f"grid_accuracy of {tg}/{dg} is not a fraction where sequences were scored",
                       bool(((cell >= 0) & (cell <= 1)).all()))
                right = int(np.rint(cell * total[t, d][scored_at]).sum())
                n = int(total[t, d][scored_at].sum())
                metrics[f"grid/{tg}/{dg}"] = right / n if n else float("nan")
                units[f"grid/{tg}/{dg}"] = np.repeat([1.0, 0.0], [right, n - right])
                for b in range(ds.sizes["bin"]):
                    metrics[f"grid/{tg}/{dg}/bin{b + 1}"] = float(last["grid_bin_accuracy"].values[t, d, b])
    if "decoded_token_accuracy" in ds:  # a feedback model: each decoding beside the main one
        for d, acc in zip(ds["decoding"].values, last["decoded_token_accuracy"].values):
            metrics[f"token_accuracy/{d}"] = float(acc)
    if "item_accuracy" in ds:  # an extended vocabulary: old and new target items
        for item, acc in zip(ds["item"].values, last["item_accuracy"].values):
            metrics[f"token_accuracy/{item}_items"] = float(acc)
    if family is not None and values:  # the task family's own metrics, as it declares them
        own, own_units = _family_metrics(path, family, values)
        metrics.update(own)
        units.update(own_units)
    return metrics, units


def _family_metrics(path: Path, family: type[Task], values: dict[str, np.ndarray]
                    ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """The metrics (and units) a family declares, from its variables at one checkpoint; a store
    lacking one of its declared variables is refused."""
    missing = [n for n in family.layout if n not in values]
    _right(path, f"lacks the variable(s) {', '.join(missing)} of the {family.name} task", not missing)
    return family.summary_metrics(values)


def _stability_trial(ds: xr.Dataset, path: Path, score: str,
                     at: int = -1) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Mean score per pair and condition at checkpoint index ``at`` (the last by default) over the triplets whose score is not
    NaN; units: every triplet's score, NaN included (summaries count them)."""
    name = f"score_{score}"
    valid = sorted(str(k)[6:] for k in ds.data_vars if str(k).startswith("score_"))
    check(name in ds, f"score: got {score!r}; {path} holds {', '.join(valid) or 'no scores'}")
    last = ds[name].isel(checkpoint=at)  # (pair, triplet)
    conditions = np.array([str(c) for c in ds["condition"].values], dtype=object)
    metrics, units = {}, {}
    for pair in ds["pair"].values:
        for cond in dict.fromkeys(conditions):
            values = last.sel(pair=pair).values[conditions == cond]
            key = f"stability/{pair}/{cond}"
            metrics[key] = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
            units[key] = values
    return metrics, units


def trial_records(path: Path, score: str = DEFAULT_SCORE, checkpoints: str = SUMMARY_CHECKPOINTS) -> list[TrialRecord]:
    """The trials in one store: one per configuration (and seed) of its checkpoints — a store of
    ``gradscope accuracy vanilla.pt pe.pt`` holds two (``store/parts.py``) — each with its config
    fields, seed, metrics at its last checkpoint, and how many of each metric's units (triplets,
    sequences) were NaN and left out of it. ``checkpoints="all"``: one record per configuration and
    checkpoint instead, each with its training ``iteration``."""
    check(checkpoints in CHECKPOINTS, f"checkpoints: got {checkpoints!r}; valid values are {', '.join(CHECKPOINTS)}")
    ds = read_store(path)
    kind = ds.attrs["kind"]
    check(kind in SUMMARIZED, f"stores: {path} is a {kind} store; summarize reads accuracy and stability stores")
    records = []
    for part in config_parts(ds):
        fields = _fields(part, path)
        train = _config(part, path, "train_config")
        if "seed" not in train:
            raise GradscopeError(f"store: {path} lacks its run configuration (the training seed); re-create it")
        seed = as_int(train["seed"], f"store: {path}: train_config seed")
        iterations = [as_int(int(i), f"store: {path}: iteration") for i in part["iteration"].values]
        for at in range(len(iterations)) if checkpoints == "all" else (-1,):
            metrics, units = (_accuracy_trial(part, path, at) if kind == "accuracy"
                              else _stability_trial(part, path, score, at))
            nan_units = {k: int(np.count_nonzero(np.isnan(v))) for k, v in units.items()}
            records.append(TrialRecord(path, kind, fields, seed, metrics, units, nan_units,
                                       iterations[at] if iterations else None))
    return records


def trial_record(path: Path, score: str = DEFAULT_SCORE) -> TrialRecord:
    """The trial in a store of one configuration (see :func:`trial_records`)."""
    records = trial_records(path, score)
    check(len(records) == 1, f"stores: {path} holds checkpoints of {len(records)} configurations; "
                             "use trial_records for one trial per configuration")
    return records[0]


def summary_dataset(entries: list[SummaryEntry], by: tuple[str, ...], attrs: dict[str, Any]) -> xr.Dataset:
    groups = list(dict.fromkeys(e.group for e in entries))
    metrics = list(dict.fromkeys(e.metric for e in entries))
    trials = max(len(e.values) for e in entries)
    shape = (len(groups), len(metrics))
    table = {name: np.full(shape, np.nan) for name in ("mean", "low", "high")}
    counts = {name: np.zeros(shape, dtype=np.int64) for name in ("n", "nan", "nan_units")}
    values = np.full((*shape, trials), np.nan)
    seeds = np.full((len(groups), trials), -1, dtype=np.int64)
    for e in entries:
        g, m = groups.index(e.group), metrics.index(e.metric)
        for name in table:
            table[name][g, m] = getattr(e.interval, name)
        for name in ("n", "nan"):
            counts[name][g, m] = getattr(e.interval, name)
        counts["nan_units"][g, m] = e.nan_units
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


def training_dataset(comparisons: list[TrainingComparison], field_name: str) -> xr.Dataset:
    """Comparisons over training as summary-store variables (docs/stores.md): per ``contrast`` (a group of
    the other fields), ``contrast_metric`` and ``iteration``, the seed-level difference b − a (``diff_mean``,
    ``diff_low``, ``diff_high``, ``diff_n``; per seed ``diff_values`` with ``diff_seed``), and per contrast
    and metric the test of whether it opens (``gap_*``: at the last tested iteration; ``change_*``: its
    change from the first; ``*_low``/``*_high``: t-interval, ``*_p``: t-test, ``*_boot_low``/``*_boot_high``:
    bootstrap over seeds, ``*_sign_p``: sign-flip test; ``verdict``; ``test_first``/``test_last``)."""
    contrasts = list(dict.fromkeys(c.label for c in comparisons))
    metrics = list(dict.fromkeys(c.metric for c in comparisons))
    iterations = sorted({p.iteration for c in comparisons for p in c.points})
    seeds = sorted({s for c in comparisons for p in c.points for s in p.seeds})
    shape, tshape = (len(contrasts), len(metrics), len(iterations)), (len(contrasts), len(metrics))
    grid = {name: np.full(shape, np.nan) for name in ("diff_mean", "diff_low", "diff_high")}
    diff_n = np.zeros(shape, dtype=np.int64)
    values = np.full((*shape, len(seeds)), np.nan)
    test = {f"{stat}_{part}": np.full(tshape, np.nan) for stat in ("gap", "change")
            for part in ("mean", "low", "high", "p", "boot_low", "boot_high", "sign_p")}
    bounds = {name: np.full(tshape, -1, dtype=np.int64) for name in ("test_first", "test_last")}
    verdicts = np.full(tshape, "", dtype=object)
    notes = np.full(tshape, "", dtype=object)
    arms = {}
    for c in comparisons:
        i, m = contrasts.index(c.label), metrics.index(c.metric)
        arms[c.label] = (c.a, c.b)
        for point in c.points:
            k = iterations.index(point.iteration)
            for name in grid:
                grid[name][i, m, k] = getattr(point.interval, name.split("_")[1])
            diff_n[i, m, k] = point.interval.n
            for s, d in zip(point.seeds, point.differences):
                values[i, m, k, seeds.index(s)] = d
        notes[i, m] = c.note
        if c.test is None:
            verdicts[i, m] = "not settled"
            continue
        verdicts[i, m] = c.test.verdict
        bounds["test_first"][i, m], bounds["test_last"][i, m] = c.first, c.last
        for stat in ("gap", "change"):
            st = getattr(c.test, stat)
            for part, value in (("mean", st.t.mean), ("low", st.t.low), ("high", st.t.high), ("p", st.t_p),
                                ("boot_low", st.bootstrap.low), ("boot_high", st.bootstrap.high),
                                ("sign_p", st.sign_p)):
                test[f"{stat}_{part}"][i, m] = value
    dims, tdims = ("contrast", "contrast_metric", "iteration"), ("contrast", "contrast_metric")
    data = {**{k: (dims, v) for k, v in grid.items()}, "diff_n": (dims, diff_n),
            "diff_values": ((*dims, "contrast_seed"), values),
            **{k: (tdims, v) for k, v in {**test, **bounds}.items()}, "verdict": (tdims, verdicts),
            "test_note": (tdims, notes)}
    coords = {"contrast": np.asarray(contrasts, dtype=object), "contrast_metric": np.asarray(metrics, dtype=object),
              "iteration": np.asarray(iterations, dtype=np.int64), "contrast_seed": np.asarray(seeds, dtype=np.int64),
              "arm_a": ("contrast", np.asarray([arms[c][0] for c in contrasts], dtype=object)),
              "arm_b": ("contrast", np.asarray([arms[c][1] for c in contrasts], dtype=object))}
    margin = next((c.test.margin for c in comparisons if c.test is not None), float("nan"))
    return xr.Dataset(data, coords=coords, attrs={"compare": field_name, "margin": margin})


def summary_attrs(command: str, by: tuple[str, ...], unit: str, method: str, confidence: float, resamples: int,
                  sources: list[Path], kind: str) -> dict[str, Any]:
    return provenance("summary", command, "cpu", {"by": list(by), "unit": unit, "method": method,
                                                  "confidence": confidence, "resamples": resamples,
                                                  "source_kind": kind, "sources": [str(p) for p in sources]})


def write_csv(entries: list[SummaryEntry], path: Path, overwrite: bool = False) -> None:
    """Tidy CSV: one row per group × metric, per-seed values in one column (seed=value;…); ``nan``
    counts trials whose value was NaN, ``nan_units`` the units (triplets, sequences) left out of the
    trials' values for being NaN. An existing file is replaced only with ``overwrite``."""
    lines = ["group,metric,mean,low,high,n,nan,nan_units,per_seed,note"]
    for e in entries:
        iv = e.interval
        per_seed = ";".join(f"{s}={v:.6g}" for s, v in zip(e.seeds, e.values))
        metric = _quoted(e.metric) if any(ch in e.metric for ch in ',"\n') else e.metric  # names come from stores
        lines.append(",".join([_quoted(e.label), metric, f"{iv.mean:.6g}", f"{iv.low:.6g}", f"{iv.high:.6g}",
                               str(iv.n), str(iv.nan), str(e.nan_units), per_seed, _quoted(iv.note)]))
    if not path.parent.is_dir():
        raise GradscopeError(f"csv: directory {path.parent} does not exist")
    text = "\n".join(lines) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), overwrite=overwrite, what="csv")


def _quoted(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'
