"""The reverse-continuous family's evaluation (paper App. B.3; moved here from
gradscope/workflows/accuracy.py): the cosine similarity of point predictions and targets on
the held-out set, per sequence and time, with a bootstrap interval of its mean per scored time."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import xarray as xr

from gradscope.analysis.cosine import cosine_similarity, position_mean_ci
from gradscope.config import RunConfig
from gradscope.files.checkpoint import Loaded
from gradscope.store.accuracy import family_dataset
from gradscope.store.records import FamilyResult
from gradscope.train.evaluate import predict_vectors
from gradscope.workflows.families.evaluation import Evaluation
from gradscope.workflows.options import AccuracyOptions


def evaluate_vectors(loaded: Loaded, opts: AccuracyOptions, device: torch.device) -> FamilyResult:
    """Cosine similarity of point predictions and targets on the held-out set of a vector task,
    per sequence and time, with a bootstrap interval of its mean per scored time: the counts its
    family's ``accuracy_part`` reads."""
    model = loaded.model.to(device)
    held = loaded.heldout.uniform
    cos = cosine_similarity(predict_vectors(model, held.inputs, opts.batch_size), held.targets).numpy()  # (n, T)
    model.to("cpu")
    times = np.flatnonzero(np.isfinite(cos).any(0))
    mean, low, high = position_mean_ci(cos[:, times], resamples=opts.resamples_used, seed=opts.seed_used)
    return FamilyResult(loaded.path, loaded.iteration, loaded.path.parent.name,
                        {"cosine": cos, "times": times, "mean": mean, "low": low, "high": high})


def vectors_dataset(results: Sequence[FamilyResult], config: RunConfig, opts: AccuracyOptions, command: str,
                    device: str) -> xr.Dataset:
    """The store of its own part alone; its ``options`` attribute records the bootstrap's."""
    return family_dataset(list(results), config, {"resamples": opts.resamples_used, "seed": opts.seed_used},
                          command, device)


VECTORS = Evaluation(options=("resamples", "seed"), evaluate=evaluate_vectors, dataset=vectors_dataset)
