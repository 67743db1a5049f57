"""`gradscope accuracy`: evaluate checkpoints on their held-out sets (SPEC §5)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import xarray as xr

from gradscope.analysis.accuracy import (bins_arg, binned_counts, grid_counts, length_counts,
                                         token_correct)
from gradscope.analysis.distance import sequence_dl_distances
from gradscope.errors import check
from gradscope.config import RunConfig
from gradscope.store.accuracy import accuracy_dataset
from gradscope.store.parts import record_checkpoint_configs
from gradscope.store.records import AccuracyResult
from gradscope.tasks import ReverseVariable, grid_batch, make_task
from gradscope.train.checkpoint import Loaded, load_checkpoint
from gradscope.train.device import resolve_device
from gradscope.train.evaluate import predict
from gradscope.tasks.lm import LanguageModel
from gradscope.workflows.lm import evaluate_lm_checkpoint
from gradscope.workflows.stability import config_attrs, expand_checkpoints


@dataclass(frozen=True)
class AccuracyOptions:
    """``grid``: None = evaluate the grid when the checkpoint has one; True = require it."""

    bins: int | tuple[int, ...] = 4
    grid: bool | None = None
    device: str = "auto"
    chunk: int = 1024
    corpus: str | None = None  # lm checkpoints: read this corpus directory instead of the recorded one


def evaluate_checkpoint(loaded: Loaded, opts: AccuracyOptions, device: torch.device) -> AccuracyResult:
    """Predictions on the uniform held-out set and (if present) the frequency grid."""
    task = make_task(loaded.config.task)
    if isinstance(task, LanguageModel):  # perplexity on the corpus's test split
        return evaluate_lm_checkpoint(loaded, device, opts.corpus)
    model = loaded.model.to(device)
    held = loaded.heldout
    if opts.grid:
        check(held.grid is not None,
              f"grid: {loaded.path} has no frequency grid (its vocabulary is {loaded.config.task.distribution}; "
              f"grids exist for dual-frequency reverse runs)")
    inputs, targets = held.uniform.inputs, held.uniform.targets
    preds = predict(model, inputs, opts.chunk)
    correct, scored = token_correct(preds, targets)
    lengths = None
    if isinstance(task, ReverseVariable):
        lc, lt = length_counts(preds, targets)
        lengths = (lc.numpy(), lt.numpy())
    grid = None
    if held.grid is not None and opts.grid is not False:
        gpreds = predict(model, grid_batch(task, held.grid).inputs, opts.chunk).reshape(*held.grid.shape[:-1], -1)
        gc, gt = grid_counts(gpreds, held.grid)
        bc, bt = binned_counts(gc, gt, bins_arg(opts.bins))
        grid = (gc.numpy(), gt.numpy(), bc.numpy(), bt.numpy())
    model.to("cpu")
    return AccuracyResult(
        loaded.path, loaded.iteration, loaded.path.parent.name,
        correct.sum(1).numpy(), scored.sum(1).numpy(), sequence_dl_distances(preds, targets).astype(np.float64),
        correct.sum(0).numpy(), scored.sum(0).numpy(),
        *(grid if grid is not None else (None,) * 4),
        *(lengths if lengths is not None else (None, None)),
    )


@dataclass(frozen=True)
class AccuracyRun:
    """A finished accuracy evaluation over checkpoints; :meth:`to_xarray` gives the accuracy store's dataset."""

    config: RunConfig  # of the first checkpoint
    results: list[AccuracyResult]
    options: AccuracyOptions
    command: str = ""
    device: str = "cpu"
    configs: tuple[dict[str, Any], ...] = ()  # each checkpoint's config attributes (config_attrs)

    def to_xarray(self) -> xr.Dataset:
        options = {"bins": bins_arg(self.options.bins), "grid": self.options.grid}
        ds = accuracy_dataset(self.results, self.config, options, self.command, self.device)
        return record_checkpoint_configs(ds, self.configs)


def run_accuracy(paths: list[Path], opts: AccuracyOptions,
                 on_start: Callable[[int], None] | None = None,
                 on_progress: Callable[[int], None] | None = None, *, command: str = "",
                 device_label: str | None = None) -> AccuracyRun:
    """Evaluate every checkpoint (run directories expand to all their checkpoints, oldest first),
    loading one at a time."""
    files = expand_checkpoints(paths)
    device = resolve_device(opts.device)
    if on_start is not None:
        on_start(len(files))
    config, results, configs = None, [], []
    for path in files:
        loaded = load_checkpoint(path)
        if config is not None:
            check(loaded.config.task == config.task,
                  f"checkpoint: {path} was trained on a different task than {files[0]}; evaluate it separately")
        config = config or loaded.config
        results.append(evaluate_checkpoint(loaded, opts, device))
        configs.append(config_attrs(loaded.config))
        del loaded
        if on_progress is not None:
            on_progress(1)
    assert config is not None  # expand_checkpoints never returns an empty list
    return AccuracyRun(config, results, opts, command, device_label if device_label is not None else str(device),
                       tuple(configs))
