"""The stability store: an xarray Dataset of per-triplet scores over checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from gradscope.analysis.stability import PAIRS
from gradscope.errors import check
from gradscope.files.io import sha256_file
from gradscope.store.io import provenance, read_store
from gradscope.tasks.probes import MEMBERS, Probes
from gradscope.store.records import CheckpointResult


def _strings(values: Any) -> np.ndarray:
    return np.asarray(list(values), dtype=object)  # variable-length UTF-8 in zarr v3, no warning


def stability_dataset(results: list[CheckpointResult], probes: Probes, options: dict[str, Any], config: dict[str, Any],
                      command: str, device: str) -> xr.Dataset:
    """Dims: checkpoint, pair (same-target, same-suffix), triplet, member (base, same-target,
    same-suffix), sv (singular-value index), position (1…L). ``options`` (plain values) are recorded
    as given; their ``target_pos`` is the target position p and ``method`` the Jacobian engine.
    ``config``: the model_config, task_config and train_config dicts to record."""
    p = options["target_pos"]
    dims3 = ("checkpoint", "pair", "triplet")
    data: dict[str, Any] = {}
    first = results[0].result
    for kind in first.scores:
        data[f"score_{kind}"] = (dims3, np.stack([r.result.scores[kind].numpy() for r in results]))
    for name in first.stats:
        data[name] = (dims3, np.stack([r.result.stats[name].numpy() for r in results]))
    if first.wirtinger_real is not None:
        data["wirtinger_real"] = (dims3, np.stack([r.result.wirtinger_real.numpy() for r in results]))
        data["wirtinger_imag"] = (dims3, np.stack([r.result.wirtinger_imag.numpy() for r in results]))
    errors = dict.fromkeys(name for r in results for name in (r.result.errors or {}))
    for name in errors:  # a sketched run: jackknife standard errors beside each estimated variable (NaN: exact)
        data[name] = (dims3, np.stack([r.result.errors[name].numpy() if name in (r.result.errors or {})
                                       else np.full(r.result.scores["default"].shape, np.nan) for r in results]))
    data["singular_values"] = (("checkpoint", "member", "triplet", "sv"),
                               np.stack([r.result.singular_values.numpy() for r in results]))
    data["probe_tokens"] = (("triplet", "member", "position"), probes.tokens.numpy())
    checkpoints = [{"path": str(r.path), "iteration": r.iteration, "run": r.run,
                    "sha256": sha256_file(r.path) if r.path.is_file() else ""} for r in results]
    coords = {
        "checkpoint": np.arange(len(results)),
        "iteration": ("checkpoint", np.array([r.iteration for r in results])),
        "checkpoint_path": ("checkpoint", _strings(c["path"] for c in checkpoints)),
        "sha256": ("checkpoint", _strings(c["sha256"] for c in checkpoints)),
        "run": ("checkpoint", _strings(c["run"] for c in checkpoints)),
        "pair": _strings(PAIRS),
        "member": _strings(MEMBERS),
        "triplet": np.arange(len(probes)),
        "target_group": ("triplet", _strings(probes.target_group)),
        "disturbant_group": ("triplet", _strings(probes.disturbant_group)),
        "condition": ("triplet", _strings(probes.conditions)),
        "target_token": ("triplet", probes.tokens[:, 0, p - 1].numpy()),
        "position": np.arange(1, probes.length + 1),
    }
    attrs = provenance("stability", command, device, {
        "target_position": p, "method": options["method"], "options": options,
        **config, "checkpoints": checkpoints,
        "score_definition": "default: sum_i <g_i^A, g_i^B> / sum_i |g_i^A||g_i^B| over rows of "
                            "J = d h_2L / d z_p (docs/definitions.md §4); NaN when every row is zero",
    })
    return xr.Dataset(data, coords=coords, attrs=attrs)


def probes_from_store(path: Path) -> Probes:
    """The probe triplets saved in a stability store (to repeat a run on another model)."""
    ds = read_store(path, kind="stability")
    check("probe_tokens" in ds, f"probes: {path} has no probe_tokens variable")
    return Probes(torch.from_numpy(ds["probe_tokens"].values.astype(np.int64)),
                  tuple(map(str, ds["target_group"].values)), tuple(map(str, ds["disturbant_group"].values)))


def probe_table_source(path: Path) -> tuple[str | None, int | None]:
    """What the probe ids of the stability store at ``path`` index: the recorded model inputs
    ("tokens" or "vectors") and seed (a vector model's ids index the table of sphere points of that
    seed); None where the store does not say."""
    ds = read_store(path, kind="stability")

    def attr(name: str) -> Any:
        value = ds.attrs.get(name)
        try:
            return json.loads(value) if isinstance(value, str) else value
        except ValueError:
            return None

    model, options = attr("model_config"), attr("options")
    inputs = model.get("inputs", "tokens") if isinstance(model, dict) else None
    seed = options.get("seed") if isinstance(options, dict) else None
    return (inputs if isinstance(inputs, str) else None,
            seed if isinstance(seed, int) and not isinstance(seed, bool) else None)
