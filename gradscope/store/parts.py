"""A store whose checkpoints come from different configurations, read as one part per configuration.

``gradscope accuracy vanilla.pt pe.pt`` (or ``stability`` over two runs) writes one store whose
checkpoints have different models, or the same model with different seeds. Its store-level config
attributes are the first checkpoint's, so anything that labels the whole store by them (a report's
legend, a summary's group and seed) would put the second model's numbers under the first model's
name. Stores record each checkpoint's own configs in their ``checkpoints`` attribute, and readers
that label by configuration go through :func:`config_parts` first.
"""

from __future__ import annotations

import json
from typing import Any

import xarray as xr

from gradscope.store.io import attr_json

CONFIG_KEYS = ("model_config", "task_config", "train_config")


def config_parts(ds: xr.Dataset) -> list[xr.Dataset]:
    """``ds`` split by configuration: one dataset per distinct (model, task, train) config of its
    checkpoints — a seed counts as a configuration here, since each seed is its own trial — in the
    order first seen, each holding only its checkpoints, with the store-level config attributes set
    to that configuration's and the ``checkpoints`` attribute cut to its entries.

    A config a checkpoint entry does not record is taken from the store level, so a store of one
    configuration, or one written before gradscope recorded per-checkpoint configs, is one part:
    ``[ds]`` itself, unchanged.
    """
    if "checkpoints" not in ds.attrs or "checkpoint" not in ds.dims:
        return [ds]
    entries = attr_json(ds, "checkpoints")
    if len(entries) != ds.sizes["checkpoint"] or not any(k in e for e in entries for k in CONFIG_KEYS):
        return [ds]
    store = {k: attr_json(ds, k) if k in ds.attrs else None for k in CONFIG_KEYS}
    configs = [{k: e.get(k, store[k]) for k in CONFIG_KEYS} for e in entries]
    groups: dict[str, list[int]] = {}
    for i, cfg in enumerate(configs):
        groups.setdefault(json.dumps(cfg, sort_keys=True), []).append(i)
    if len(groups) == 1:
        return [ds]
    parts = []
    for idx in groups.values():
        part = ds.isel(checkpoint=idx)
        part.attrs = {**ds.attrs, **{k: json.dumps(v) for k, v in configs[idx[0]].items() if v is not None},
                      "checkpoints": json.dumps([entries[i] for i in idx])}
        parts.append(part)
    return parts


def record_checkpoint_configs(ds: xr.Dataset, configs: tuple[dict[str, Any], ...]) -> xr.Dataset:
    """``ds`` with each checkpoint's own configs (``{model_config, task_config, train_config}``, in
    checkpoint order) written into its ``checkpoints`` attribute, where :func:`config_parts` reads them."""
    entries = attr_json(ds, "checkpoints")
    for entry, cfg in zip(entries, configs):
        entry.update(cfg)
    ds.attrs["checkpoints"] = json.dumps(entries)
    return ds
