"""`gradscope accuracy`: evaluate checkpoints on their held-out sets (SPEC §5)."""

from __future__ import annotations

import warnings
from dataclasses import InitVar, dataclass
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
from gradscope.files.checkpoint import Loaded
from gradscope.train.device import resolve_device
from gradscope.train.evaluate import predict
from gradscope.workflows.common import (MAX_COUNT, as_count, checkpoint_sources, config_attrs, expand_checkpoints,
                                        load_source)


@dataclass(frozen=True)
class AccuracyOptions:
    """Each field is named as its ``gradscope accuracy`` flag. ``grid``: None = evaluate the grid when
    the checkpoint has one; True = require it, False = skip it. ``batch_size``: sequences per forward pass."""

    bins: int | tuple[int, ...] = 4
    grid: bool | None = None
    device: str = "auto"
    batch_size: int = 1024
    chunk: InitVar[int | None] = None  # batch_size's name before issue #24 (a keyword only; read batch_size)

    def __post_init__(self, chunk: int | None) -> None:
        if chunk is not None:
            warnings.warn("AccuracyOptions(chunk=…) is now batch_size=…, as its flag", DeprecationWarning, stacklevel=3)
            object.__setattr__(self, "batch_size", chunk)
        object.__setattr__(self, "batch_size", as_count(self.batch_size, "batch_size", 1, MAX_COUNT))


def evaluate_checkpoint(loaded: Loaded, opts: AccuracyOptions, device: torch.device) -> AccuracyResult:
    """Predictions on the uniform held-out set and (if present) the frequency grid."""
    task = make_task(loaded.config.task)
    model = loaded.model.to(device)
    held = loaded.heldout
    if opts.grid:
        check(held.grid is not None,
              f"grid: {loaded.path} has no frequency grid (its vocabulary is {loaded.config.task.distribution}; "
              f"grids exist for dual-frequency reverse runs)")
    inputs, targets = held.uniform.inputs, held.uniform.targets
    preds = predict(model, inputs, opts.batch_size)
    correct, scored = token_correct(preds, targets)
    lengths = None
    if isinstance(task, ReverseVariable):
        lc, lt = length_counts(preds, targets)
        lengths = (lc.numpy(), lt.numpy())
    grid = None
    if held.grid is not None and opts.grid is not False:
        gpreds = predict(model, grid_batch(task, held.grid).inputs, opts.batch_size).reshape(*held.grid.shape[:-1], -1)
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


def run_accuracy(paths: list[Path | Loaded], opts: AccuracyOptions,
                 on_start: Callable[[int], None] | None = None,
                 on_progress: Callable[[int], None] | None = None, *, command: str = "",
                 device_label: str | None = None) -> AccuracyRun:
    """Evaluate every checkpoint (run directories expand to all their checkpoints, oldest first),
    loading one at a time (a :class:`Loaded` is used as it is)."""
    files = expand_checkpoints(paths)
    device = resolve_device(opts.device)
    if on_start is not None:
        on_start(len(files))
    config, results, configs = None, [], []
    for item in files:
        loaded = load_source(item)
        if config is not None:
            check(loaded.config.task == config.task,
                  f"checkpoint: {loaded.path} was trained on a different task than the first; evaluate it separately")
        config = config or loaded.config
        results.append(evaluate_checkpoint(loaded, opts, device))
        configs.append(config_attrs(loaded.config))
        del loaded
        if on_progress is not None:
            on_progress(1)
    assert config is not None  # expand_checkpoints never returns an empty list
    return AccuracyRun(config, results, opts, command, device_label if device_label is not None else str(device),
                       tuple(configs))


def accuracy(source: Any, *, bins: int | tuple[int, ...] = 4, grid: bool | None = None, device: str = "auto",
             batch_size: int = 1024) -> xr.Dataset:
    """Accuracy on the held-out sets (SPEC §5) as an xarray Dataset with the variables of an accuracy
    store: token, sequence and Damerau–Levenshtein accuracy per checkpoint, and the frequency grid
    by target position when the checkpoint has one. Options are named as ``gradscope accuracy``'s flags.

    source: a checkpoint file or run directory (or a list of them: every checkpoint, oldest first),
    or a :class:`~gradscope.files.checkpoint.Loaded` (not read again). A model of your own has no
    held-out set: evaluate it in your own code.
    bins: the grid's target-position bins, a count (4 = quarters) or 0-based edges.
    """
    return run_accuracy(checkpoint_sources(source), AccuracyOptions(bins, grid, device, batch_size)).to_xarray()
