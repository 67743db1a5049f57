"""The reverse-continuous family's evaluation (paper App. B.3; moved here from
gradscope/workflows/accuracy.py, issue #39): the cosine similarity of point predictions and targets on
the held-out set, per sequence and time, with a bootstrap interval of its mean per scored time."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import xarray as xr

from gradscope.analysis.cosine import cosine_similarity, position_mean_ci
from gradscope.config import RunConfig
from gradscope.files.checkpoint import Loaded
from gradscope.store.cosine import cosine_dataset
from gradscope.store.records import CosineResult
from gradscope.train.evaluate import predict_vectors
from gradscope.workflows.families.evaluation import Evaluation
from gradscope.workflows.options import AccuracyOptions


def evaluate_vectors(loaded: Loaded, opts: AccuracyOptions, device: torch.device) -> CosineResult:
    """Cosine similarity of point predictions and targets on the held-out set of a vector task,
    per sequence and time, with a bootstrap interval of its mean per scored time."""
    model = loaded.model.to(device)
    held = loaded.heldout.uniform
    cos = cosine_similarity(predict_vectors(model, held.inputs, opts.batch_size), held.targets).numpy()  # (n, T)
    model.to("cpu")
    times = np.flatnonzero(np.isfinite(cos).any(0))
    mean, low, high = position_mean_ci(cos[:, times], resamples=opts.resamples_used, seed=opts.seed_used)
    return CosineResult(loaded.path, loaded.iteration, loaded.path.parent.name, cos, times, mean, low, high)


def vectors_dataset(results: Sequence[CosineResult], config: RunConfig, opts: AccuracyOptions, command: str,
                    device: str) -> xr.Dataset:
    """The store of its own part alone; its ``options`` attribute records the bootstrap's."""
    return cosine_dataset(list(results), config, {"resamples": opts.resamples_used, "seed": opts.seed_used},
                          command, device)


VECTORS = Evaluation(options=("resamples", "seed"), evaluate=evaluate_vectors, dataset=vectors_dataset)
