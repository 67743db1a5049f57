"""The accuracy store of a vector task (paper App. B.3): cosine similarity of point predictions
and targets over checkpoints (layout in docs/stores.md)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import xarray as xr

from gradscope.config import RunConfig
from gradscope.store.io import provenance, sha256_file
from gradscope.store.records import CosineResult


def cosine_dataset(results: list[CosineResult], config: RunConfig, options: dict[str, Any], command: str,
                   device: str) -> xr.Dataset:
    """Dims: checkpoint, sequence, time (1-based, scored output times). Variables:
    ``cosine_similarity`` (checkpoint), ``position_cosine`` and its bootstrap bounds
    ``position_cosine_low``/``_high`` (checkpoint, time), ``sequence_cosine`` (checkpoint, sequence)."""
    first = results[0]
    stack = lambda name: np.stack([getattr(r, name) for r in results])  # noqa: E731
    data: dict[str, Any] = {
        "cosine_similarity": ("checkpoint", np.array([r.cosine_similarity for r in results])),
        "position_cosine": (("checkpoint", "time"), stack("position_mean")),
        "position_cosine_low": (("checkpoint", "time"), stack("position_low")),
        "position_cosine_high": (("checkpoint", "time"), stack("position_high")),
        "sequence_cosine": (("checkpoint", "sequence"), stack("sequence_cosine")),
    }
    checkpoints = [{"path": str(r.path), "iteration": r.iteration, "run": r.run, "sha256": sha256_file(r.path)}
                   for r in results]
    coords: dict[str, Any] = {
        "checkpoint": np.arange(len(results)),
        "iteration": ("checkpoint", np.array([r.iteration for r in results])),
        "checkpoint_path": ("checkpoint", np.asarray([str(r.path) for r in results], dtype=object)),
        "run": ("checkpoint", np.asarray([r.run for r in results], dtype=object)),
        "sha256": ("checkpoint", np.asarray([c["sha256"] for c in checkpoints], dtype=object)),
        "sequence": np.arange(first.cosine.shape[0]),
        "time": first.times + 1,
    }
    attrs = provenance("accuracy", command, device, {
        "model_config": dataclasses.asdict(config.model), "task_config": dataclasses.asdict(config.task),
        "train_config": dataclasses.asdict(config.train), "checkpoints": checkpoints, "options": options,
    })
    return xr.Dataset(data, coords=coords, attrs=attrs)
