"""`gradscope accuracy`: evaluate checkpoints on their held-out sets (SPEC §5)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from gradscope.analysis.accuracy import binned_counts, grid_counts, length_counts, position_bins, token_correct
from gradscope.analysis.distance import sequence_dl_distances
from gradscope.errors import check
from gradscope.tasks import ReverseVariable, grid_batch, make_task
from gradscope.train.checkpoint import Loaded, load_checkpoint
from gradscope.train.device import resolve_device
from gradscope.train.evaluate import predict
from gradscope.workflows.stability import expand_checkpoints


@dataclass(frozen=True)
class AccuracyOptions:
    """``grid``: None = evaluate the grid when the checkpoint has one; True = require it."""

    bins: int | tuple[int, ...] = 4
    grid: bool | None = None
    device: str = "auto"
    chunk: int = 1024


@dataclass(frozen=True)
class AccuracyResult:
    """One checkpoint's evaluation. Counts are exact integers; ratios are derived from them.

    sequence_correct / sequence_scored (n,): scored tokens right / scored per held-out sequence;
    sequence_dl (n,): Damerau–Levenshtein distance per sequence; time_correct / time_scored (T,);
    grid_correct / grid_total (2, 2, L) and their binned versions (2, 2, bins), or None;
    length_correct / length_total (L_max + 1,) for reverse-variable, else None.
    """

    path: Path
    iteration: int
    run: str
    sequence_correct: np.ndarray
    sequence_scored: np.ndarray
    sequence_dl: np.ndarray
    time_correct: np.ndarray
    time_scored: np.ndarray
    grid_correct: np.ndarray | None
    grid_total: np.ndarray | None
    grid_bin_correct: np.ndarray | None
    grid_bin_total: np.ndarray | None
    length_correct: np.ndarray | None
    length_total: np.ndarray | None

    @property
    def token_accuracy(self) -> float:
        return float(self.sequence_correct.sum() / max(self.sequence_scored.sum(), 1)) if self.sequence_scored.size \
            else float("nan")

    @property
    def sequence_accuracy(self) -> float:
        return float((self.sequence_correct == self.sequence_scored).mean()) if self.sequence_scored.size \
            else float("nan")

    @property
    def dl_distance(self) -> float:
        return float(self.sequence_dl.mean()) if self.sequence_dl.size else float("nan")


def evaluate_checkpoint(loaded: Loaded, opts: AccuracyOptions, device: torch.device) -> AccuracyResult:
    """Predictions on the uniform held-out set and (if present) the frequency grid."""
    task = make_task(loaded.config.task)
    model = loaded.model.to(device)
    held = loaded.heldout
    if opts.grid:
        check(held.grid is not None,
              f"--grid: {loaded.path} has no frequency grid (its vocabulary is {loaded.config.task.distribution}; "
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


def run_accuracy(paths: list[Path], opts: AccuracyOptions,
                 on_start: Callable[[int], None] | None = None,
                 on_progress: Callable[[int], None] | None = None) -> tuple[list[Loaded], list[AccuracyResult]]:
    """Evaluate every checkpoint (run directories expand to all their checkpoints, oldest first)."""
    files = expand_checkpoints(paths)
    device = resolve_device(opts.device)
    if on_start is not None:
        on_start(len(files))
    loaded_all, results = [], []
    for path in files:
        loaded = load_checkpoint(path)
        if loaded_all:
            check(loaded.config.task == loaded_all[0].config.task,
                  f"checkpoint: {path} was trained on a different task than {files[0]}; evaluate it separately")
        results.append(evaluate_checkpoint(loaded, opts, device))
        loaded_all.append(loaded)
        if on_progress is not None:
            on_progress(1)
    return loaded_all, results


def bin_edges(length: int, bins: int | tuple[int, ...]) -> list[tuple[int, int]]:
    """1-based inclusive (start, end) of each target-position bin."""
    return position_bins(length, bins_arg(bins))


def bins_arg(bins: int | tuple[int, ...]) -> int | list[int]:
    """The bins option as the analysis functions take it (a count, or a list of edges)."""
    return list(bins) if isinstance(bins, tuple) else bins
