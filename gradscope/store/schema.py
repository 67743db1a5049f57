"""The layout each kind of store must have once loaded (docs/stores.md), checked in one place so
that the code that reads stores may index them without guarding every access.

Rules: a variable of a known name must have its documented dims and dtype; a dimension that is
present brings the coordinates that readers look it up by (``pair`` needs its labels, ``triplet``
its condition, …); label coordinates are unique; counts are non-negative; the JSON attributes
decode to what they should. Variables of unknown names are left alone (a later gradscope may add
some), and nothing is required of a store that holds nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from gradscope.errors import GradscopeError
from gradscope.fields import as_int
from gradscope.tasks.registry import TASKS

FLOAT, INT, COUNT, STR = "float", "int", "count", "str"
_STAB3 = ("checkpoint", "pair", "triplet")
_GRID = ("target_group", "disturbant_group")
STATS = ("cos_mean", "cos_min", "cos_max", "fro_a", "fro_b", "fro_diff", "spectral_a", "spectral_b", "eff_rank_a",
         "eff_rank_b", "subspace_sim", "forward_sim", "wirtinger_real", "wirtinger_imag")
_CHECKPOINT = {"checkpoint": (("checkpoint",), INT), "iteration": (("checkpoint",), INT),
               "checkpoint_path": (("checkpoint",), STR), "sha256": (("checkpoint",), STR),
               "run": (("checkpoint",), STR), "model": (("checkpoint",), STR)}

# kind → variable → (dims, dtype). score_* variables of a stability store follow "score_".
LAYOUTS: dict[str, dict[str, tuple[tuple[str, ...], str]]] = {
    "stability": {**_CHECKPOINT, "score_": (_STAB3, FLOAT), **{s: (_STAB3, FLOAT) for s in STATS},
                  "singular_values": (("checkpoint", "member", "triplet", "sv"), FLOAT),
                  "probe_tokens": (("triplet", "member", "position"), INT),
                  "pair": (("pair",), STR), "member": (("member",), STR), "triplet": (("triplet",), INT),
                  "target_group": (("triplet",), STR), "disturbant_group": (("triplet",), STR),
                  "condition": (("triplet",), STR), "target_token": (("triplet",), INT),
                  "position": (("position",), INT)},
    "accuracy": {**_CHECKPOINT, "token_accuracy": (("checkpoint",), FLOAT),
                 "sequence_accuracy": (("checkpoint",), FLOAT), "dl_distance": (("checkpoint",), FLOAT),
                 "position_accuracy": (("checkpoint", "time"), FLOAT),
                 "sequence_correct": (("checkpoint", "sequence"), COUNT), "sequence_scored": (("sequence",), COUNT),
                 "sequence_dl": (("checkpoint", "sequence"), FLOAT),
                 "grid_accuracy": (("checkpoint", *_GRID, "target_position"), FLOAT),
                 "grid_bin_accuracy": (("checkpoint", *_GRID, "bin"), FLOAT),
                 "grid_n": ((*_GRID, "bin"), COUNT), "grid_total": ((*_GRID, "target_position"), COUNT),
                 "decoded_token_accuracy": (("checkpoint", "decoding"), FLOAT),
                 "decoded_position_accuracy": (("checkpoint", "decoding", "time"), FLOAT),
                 "item_accuracy": (("checkpoint", "item"), FLOAT), "item_n": (("item",), COUNT),
                 "item_position_accuracy": (("checkpoint", "item", "time"), FLOAT),
                 "grid_item_bin_accuracy": (("checkpoint", *_GRID, "item", "bin"), FLOAT),
                 "decoding": (("decoding",), STR), "item": (("item",), STR),
                 "sequence": (("sequence",), INT), "time": (("time",), INT),
                 "target_group": (("target_group",), STR), "disturbant_group": (("disturbant_group",), STR),
                 "target_position": (("target_position",), INT), "bin": (("bin",), INT),
                 "bin_start": (("bin",), INT), "bin_end": (("bin",), INT),
                 # raw text: bootstrap bounds over paragraphs of the language-model family's variables (its
                 # own part, like every family's, comes from its layout: family_layouts)
                 **{f"{v}_{end}": (("checkpoint", *dims), FLOAT) for end in ("low", "high") for v, dims in (
                     ("perplexity", ()), ("token_accuracy", ()), ("freq_perplexity", ("freq_bin",)),
                     ("freq_accuracy", ("freq_bin",)), ("pos_perplexity", ("pos_bin",)),
                     ("pos_accuracy", ("pos_bin",)))}},
    "dynamics": {**_CHECKPOINT, "flow_fro": (("checkpoint", "sequence", "step"), FLOAT),
                 "flow_spectral": (("checkpoint", "sequence", "step"), FLOAT),
                 "tT_grid": (("checkpoint", "grid_sequence", "t", "T"), FLOAT),
                 "step_radius": (("checkpoint", "sequence", "step"), FLOAT),
                 "step_sv": (("checkpoint", "sequence", "step", "sv"), FLOAT),
                 "lyapunov": (("checkpoint", "trajectory", "exponent"), FLOAT),
                 "lyapunov_below_resolution": (("checkpoint", "trajectory", "exponent"), COUNT),
                 "lyapunov_running": (("checkpoint", "lyap_step", "exponent"), FLOAT),
                 "gate_norm": (("checkpoint", "sequence", "step", "gate"), FLOAT),
                 "block_norm": (("checkpoint", "block"), FLOAT), "block_radius": (("checkpoint", "block"), FLOAT),
                 "sequence": (("sequence",), INT), "step": (("step",), INT), "tokens": (("sequence", "step"), INT),
                 "token_class": (("sequence", "step"), STR), "condition": (("sequence",), STR),
                 "gate": (("gate",), STR), "block": (("block",), STR), "lyap_step": (("lyap_step",), INT),
                 "trajectory": (("trajectory",), INT), "exponent": (("exponent",), INT)},
    "summary": {"mean": (("group", "metric"), FLOAT), "low": (("group", "metric"), FLOAT),
                "high": (("group", "metric"), FLOAT), "n": (("group", "metric"), COUNT),
                "nan": (("group", "metric"), COUNT), "nan_units": (("group", "metric"), COUNT),
                "values": (("group", "metric", "trial"), FLOAT), "seed": (("group", "trial"), INT),
                "group": (("group",), INT), "metric": (("metric",), STR), "trial": (("trial",), INT),
                "label": (("group",), STR),
                # two arms compared over training (summarize --checkpoints all --compare FIELD)
                **{v: (("contrast", "contrast_metric", "iteration"), FLOAT) for v in ("diff_mean", "diff_low",
                                                                                     "diff_high")},
                "diff_n": (("contrast", "contrast_metric", "iteration"), COUNT),
                "diff_values": (("contrast", "contrast_metric", "iteration", "contrast_seed"), FLOAT),
                **{f"{stat}_{part}": (("contrast", "contrast_metric"), FLOAT) for stat in ("gap", "change")
                   for part in ("mean", "low", "high", "p", "boot_low", "boot_high", "sign_p")},
                "test_first": (("contrast", "contrast_metric"), INT), "test_last": (("contrast", "contrast_metric"), INT),
                "verdict": (("contrast", "contrast_metric"), STR), "test_note": (("contrast", "contrast_metric"), STR),
                "contrast": (("contrast",), STR), "contrast_metric": (("contrast_metric",), STR),
                "iteration": (("iteration",), INT), "contrast_seed": (("contrast_seed",), INT),
                "arm_a": (("contrast",), STR), "arm_b": (("contrast",), STR)},
}
# kind → dimension → the coordinates readers look it up by, required whenever the dimension exists
NEEDS: dict[str, dict[str, tuple[str, ...]]] = {
    "stability": {"checkpoint": ("iteration",), "pair": ("pair",), "member": ("member",),
                  "triplet": ("condition", "target_group", "disturbant_group")},
    "accuracy": {"checkpoint": ("iteration",), "target_group": ("target_group",),
                 "disturbant_group": ("disturbant_group",), "bin": ("bin", "bin_start", "bin_end")},
    "dynamics": {"checkpoint": ("iteration",), "sequence": ("condition",), "step": ("token_class",),
                 "gate": ("gate",), "block": ("block",), "lyap_step": ("lyap_step",)},
    "summary": {"group": ("label",), "metric": ("metric",), "contrast": ("contrast", "arm_a", "arm_b"),
                "contrast_metric": ("contrast_metric",), "iteration": ("iteration",)},
}
REQUIRED = {"summary": ("mean", "low", "high", "n", "metric")}  # what every reader of the kind takes
LABELS = ("pair", "member", "target_group", "disturbant_group", "gate", "block", "metric", "decoding", "item")  # unique values
CONFIGS = ("model_config", "task_config", "train_config")


def _kind_ok(values: np.ndarray, dtype: str) -> bool:
    k = values.dtype.kind
    if dtype == STR:
        return k in "OUT"
    if dtype == FLOAT:
        return k == "f"
    ok = k in "iu"
    return ok and (dtype != COUNT or values.size == 0 or int(values.min()) >= 0)


def family_layouts() -> dict[str, tuple[tuple[str, ...], str]]:
    """Every registered task family's part of an accuracy store (its ``layout``), by variable."""
    return {name: (v.dims, v.kind) for cls in TASKS.values() for name, v in cls.layout.items()}


def family_needs() -> dict[str, tuple[str, ...]]:
    """Every registered family's dimensions → the coordinates readers look them up by."""
    return {dim: coords for cls in TASKS.values() for dim, coords in cls.needs.items()}


def family_labels() -> tuple[str, ...]:
    """The families' label coordinates: strings over a dimension of their own name."""
    return tuple(name for name, (dims, kind) in family_layouts().items() if kind == STR and dims == (name,))


def _layout(kind: str, name: str) -> tuple[tuple[str, ...], str] | None:
    layout = LAYOUTS.get(kind, {})
    if name in layout:
        return layout[name]
    if kind == "accuracy":
        return family_layouts().get(name)
    return layout.get("score_") if kind == "stability" and name.startswith("score_") else None


def check_layout(ds: xr.Dataset, kind: str, path: Path) -> None:
    """Refuse a loaded store whose variables, coordinates or dims break the layout of ``kind``."""
    what = f"store: {path}"
    for name, var in ds.variables.items():
        want = _layout(kind, str(name))
        if want is None:
            continue
        dims, dtype = want
        if var.dims != dims:
            raise GradscopeError(f"{what}: {name} has dims {var.dims}; a {kind} store has it over {dims}. "
                                 f"Re-create the store")
        if not _kind_ok(var.values, dtype):
            expected = {FLOAT: "floats", INT: "integers", COUNT: "non-negative integers", STR: "strings"}[dtype]
            raise GradscopeError(f"{what}: {name} holds {var.dtype} values; expected {expected}. Re-create the store")
    missing = [n for n in REQUIRED.get(kind, ()) if n not in ds.variables]
    if missing:
        raise GradscopeError(f"{what}: lacks the variable(s) {', '.join(missing)} of a {kind} store (deleted?); "
                             f"re-create it")
    needs = {**NEEDS.get(kind, {}), **(family_needs() if kind == "accuracy" else {})}
    for dim, coords in needs.items():
        if dim not in ds.dims:
            continue
        missing = [c for c in coords if c not in ds.variables]
        if missing:
            raise GradscopeError(f"{what}: lacks the coordinate(s) {', '.join(missing)} of its {dim} dimension "
                                 f"(deleted?); re-create the store")
    for name in (*LABELS, *(family_labels() if kind == "accuracy" else ())):
        if name in ds.coords and ds[name].dims == (name,):
            labels = [str(v) for v in ds[name].values]
            if len(set(labels)) != len(labels):
                raise GradscopeError(f"{what}: its {name} labels repeat ({', '.join(labels[:6])}); re-create it")
    if "checkpoint" in ds.dims and ds.sizes["checkpoint"] == 0:
        raise GradscopeError(f"{what}: holds no checkpoint")


def _json_attr(attrs: dict[str, Any], key: str, types: type | tuple[type, ...], what: str) -> Any:
    raw = attrs[key]
    try:
        value = json.loads(raw) if isinstance(raw, str) else None
    except (json.JSONDecodeError, RecursionError):
        value = None
    if not isinstance(value, types):
        expected = "a JSON object" if types is dict else "a JSON list"
        raise GradscopeError(f"{what}: its attribute {key!r} is {str(raw)[:40]!r}; expected {expected} (as text)")
    return value


def check_attrs(attrs: dict[str, Any], kind: str, path: Path) -> None:
    """Refuse attributes that readers decode but that do not decode to what a gradscope store holds:
    the configs (JSON objects, an integer seed), the checkpoint list, a summary's grouping fields
    and confidence level."""
    what = f"store: {path}"
    for key in CONFIGS:
        if key in attrs:
            cfg = _json_attr(attrs, key, dict, what)
            if key == "train_config" and "seed" in cfg:
                as_int(cfg["seed"], f"{what}: train_config seed")
    if "checkpoints" in attrs:
        for entry in _json_attr(attrs, "checkpoints", list, what):
            ok = isinstance(entry, dict) and isinstance(entry.get("path", ""), str) \
                and isinstance(entry.get("sha256", ""), str) and isinstance(entry.get("run", ""), str) \
                and (entry.get("iteration") is None or (isinstance(entry["iteration"], int)
                                                       and not isinstance(entry["iteration"], bool)))
            if not ok:
                raise GradscopeError(f"{what}: its checkpoints attribute has an entry {str(entry)[:60]!r}; expected "
                                     f"{{path, iteration, run, sha256}}")
            for key in CONFIGS:  # each checkpoint's own configs (store/parts.py), where recorded
                if not isinstance(entry.get(key, {}), dict):
                    raise GradscopeError(f"{what}: its checkpoints attribute has a {key} that is not an object")
                if key == "train_config" and "seed" in entry.get(key, {}):
                    as_int(entry[key]["seed"], f"{what}: a checkpoint's train_config seed")
    if "options" in attrs and isinstance(attrs["options"], str):
        try:
            json.loads(attrs["options"])
        except (json.JSONDecodeError, RecursionError):
            raise GradscopeError(f"{what}: its attribute 'options' is not JSON") from None
    if kind == "summary":
        if "by" in attrs:
            by = _json_attr(attrs, "by", list, what)
            if not all(isinstance(b, str) for b in by):
                raise GradscopeError(f"{what}: its attribute 'by' lists {str(by)[:40]!r}; expected field names")
        conf = attrs.get("confidence", 0.95)
        if isinstance(conf, bool) or not isinstance(conf, (int, float)) or not 0 < conf < 1:
            raise GradscopeError(f"{what}: its attribute 'confidence' is {str(conf)[:40]!r}; expected a level in "
                                 f"(0, 1)")


def check_summary_fields(ds: xr.Dataset, path: Path) -> None:
    """A summary store's grouping fields are coordinates over its groups (reports label groups by them)."""
    by = json.loads(ds.attrs["by"]) if "by" in ds.attrs else []
    for name in by:
        if name not in ds.coords or ds[name].dims != ("group",):
            raise GradscopeError(f"store: {path}: groups by {name!r} but has no {name} coordinate over its groups; "
                                 f"re-create it")
        if name.endswith("_size") or name in ("num_layers", "length"):
            for v in ds[name].values:
                if not str(v).lstrip("-").isdigit():
                    raise GradscopeError(f"store: {path}: its {name} coordinate holds {str(v)[:20]!r}; expected "
                                         f"integers")
