"""The default evaluation of a task family: argmax predictions on its held-out sets (docs/definitions.md §5).

Token, sequence and Damerau–Levenshtein accuracy on the uniform held-out set, the frequency grid where
the checkpoint has one, the family's own counts (its ``score``); and two model features that are no
family's: a feedback model's decodings (paper App. B.2) and an extended vocabulary's old and new items
(paper §4.2)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import xarray as xr

from gradscope.analysis.accuracy import bins_arg, binned_counts, grid_counts, grid_item_counts, token_correct
from gradscope.analysis.distance import sequence_dl_distances
from gradscope.config import RunConfig
from gradscope.errors import check
from gradscope.files.checkpoint import Loaded
from gradscope.store.accuracy import accuracy_dataset
from gradscope.store.records import AccuracyResult
from gradscope.tasks import Batch, grid_batch, make_task
from gradscope.train.evaluate import predict, predict_decoded
from gradscope.workflows.families.evaluation import Evaluation
from gradscope.workflows.options import AccuracyOptions


def decodings_for(loaded: Loaded, opts: AccuracyOptions) -> tuple[str, ...]:
    """The decodings to evaluate: () for a standard model (``decoding`` must then be both)."""
    if not loaded.model.config.feedback:
        check(opts.decoding == "both", f"decoding: got {opts.decoding!r}, but {loaded.path} is a standard model "
                                       f"(no feedback input); decoding applies to models trained with --decoding")
        return ()
    return ("autoregressive", "teacher") if opts.decoding == "both" else (opts.decoding,)


def _predict(model: torch.nn.Module, batch: Batch, decoding: str, chunk: int) -> torch.Tensor:
    """Argmax predictions (n, T): the standard model's :func:`predict`, a feedback model's decoded."""
    return predict(model, batch.inputs, chunk) if decoding == "none" else predict_decoded(model, batch, decoding, chunk)


def evaluate_checkpoint(loaded: Loaded, opts: AccuracyOptions, device: torch.device) -> AccuracyResult:
    """Predictions on the uniform held-out set and (if present) the frequency grid; a feedback
    model's under each decoding of :func:`decodings_for` (the first is the main one); an extended
    vocabulary's also per old and new target item."""
    task = make_task(loaded.config.task)
    decodings = decodings_for(loaded, opts)
    model = loaded.model.to(device)
    held = loaded.heldout
    check(opts.bins is None or (held.grid is not None and opts.grid is not False),
          f"bins: {loaded.path} has no frequency grid to bin" if held.grid is None else
          "bins: they bin the frequency grid, which grid=False (--no-grid) skips; leave one of them out")
    if opts.grid:
        check(held.grid is not None,
              f"grid: {loaded.path} has no frequency grid (its vocabulary is {loaded.config.task.distribution}; "
              f"grids exist for dual-frequency reverse runs)")
    targets = held.uniform.targets
    main = decodings[0] if decodings else "none"
    preds = _predict(model, held.uniform, main, opts.batch_size)
    correct, scored = token_correct(preds, targets)
    extra: dict[str, Any] = {}
    if decodings:
        counts = [token_correct(_predict(model, held.uniform, d, opts.batch_size) if d != main else preds, targets)
                  for d in decodings]
        extra.update(decodings=decodings, decoded_time_correct=np.stack([c.sum(0).numpy() for c, _ in counts]),
                     decoded_time_scored=np.stack([s.sum(0).numpy() for _, s in counts]))
    old = loaded.config.task.old_items
    if old:
        new = targets >= old
        extra.update(item_time_correct=np.stack([(correct & m).sum(0).numpy() for m in (~new, new)]),
                     item_time_scored=np.stack([(scored & m).sum(0).numpy() for m in (~new, new)]))
    grid = None
    if held.grid is not None and opts.grid is not False:
        gpreds = _predict(model, grid_batch(task, held.grid), main, opts.batch_size)
        gpreds = gpreds.reshape(*held.grid.shape[:-1], -1)
        gc, gt = grid_counts(gpreds, held.grid)
        if old:
            ic, it = grid_item_counts(gpreds, held.grid, old)
            extra.update(grid_item_correct=ic.numpy(), grid_item_total=it.numpy())
        bc, bt = binned_counts(gc, gt, bins_arg(opts.bins_for(gc.shape[-1])))
        grid = (gc.numpy(), gt.numpy(), bc.numpy(), bt.numpy())
    model.to("cpu")
    return AccuracyResult(
        loaded.path, loaded.iteration, loaded.path.parent.name,
        correct.sum(1).numpy(), scored.sum(1).numpy(), sequence_dl_distances(preds, targets).astype(np.float64),
        correct.sum(0).numpy(), scored.sum(0).numpy(),
        *(grid if grid is not None else ()), family=task.score(held.uniform, preds), **extra,
    )


def tokens_dataset(results: Sequence[AccuracyResult], config: RunConfig, opts: AccuracyOptions, command: str,
                   device: str) -> xr.Dataset:
    """The accuracy store's dataset; its ``options`` attribute records bins (as used), grid and decoding."""
    grid = results[0].grid_correct if results else None
    options = {"bins": bins_arg(opts.bins_for(None if grid is None else grid.shape[-1])), "grid": opts.grid,
               "decoding": opts.decoding}
    return accuracy_dataset(list(results), config, options, command, device)


TOKENS = Evaluation(options=("bins", "grid", "decoding"), evaluate=evaluate_checkpoint, dataset=tokens_dataset)
