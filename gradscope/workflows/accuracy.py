"""`gradscope accuracy`: evaluate checkpoints on their held-out sets (SPEC §5)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import xarray as xr

from gradscope.analysis.accuracy import bins_arg, binned_counts, grid_counts, grid_item_counts, token_correct
from gradscope.analysis.cosine import cosine_similarity, position_mean_ci
from gradscope.analysis.distance import sequence_dl_distances
from gradscope.errors import check
from gradscope.config import RunConfig
from gradscope.store.accuracy import accuracy_dataset
from gradscope.store.parts import record_checkpoint_configs
from gradscope.store.cosine import cosine_dataset
from gradscope.store.records import AccuracyResult, CosineResult
from gradscope.tasks import TASKS, Batch, grid_batch, make_task
from gradscope.files.checkpoint import Loaded
from gradscope.train.device import resolve_device
from gradscope.train.evaluate import predict, predict_decoded, predict_vectors
from gradscope.workflows.common import checkpoint_sources, config_attrs, expand_checkpoints, load_source
from gradscope.workflows.lm import evaluate_lm_checkpoint
from gradscope.workflows.options import AccuracyOptions  # declared there, torch-free (a command's --help)



def decodings_for(loaded: Loaded, opts: AccuracyOptions) -> tuple[str, ...]:
    """The decodings to evaluate: () for a standard model (``decoding`` must then be both)."""
    if not loaded.model.config.feedback:
        check(opts.decoding == "both", f"decoding: got {opts.decoding!r}, but {loaded.path} is a standard model "
                                       f"(no feedback input); decoding applies to models trained with --decoding")
        return ()
    return ("autoregressive", "teacher") if opts.decoding == "both" else (opts.decoding,)


def evaluate_vectors(loaded: Loaded, opts: AccuracyOptions, device: torch.device) -> CosineResult:
    """Cosine similarity of point predictions and targets on the held-out set of a vector task,
    per sequence and time, with a bootstrap interval of its mean per scored time."""
    decodings_for(loaded, opts)  # a vector model has no feedback input: no decoding to choose
    check(not opts.grid, f"grid: {loaded.path} has no frequency grid (a vector task has one frequency class)")
    check(opts.bins is None, f"bins: {loaded.path} has no frequency grid to bin (a vector task has one frequency class)")
    check(opts.corpus is None, f"corpus: {loaded.path} is not an lm checkpoint; corpus applies to lm runs only")
    model = loaded.model.to(device)
    held = loaded.heldout.uniform
    cos = cosine_similarity(predict_vectors(model, held.inputs, opts.batch_size), held.targets).numpy()  # (n, T)
    model.to("cpu")
    times = np.flatnonzero(np.isfinite(cos).any(0))
    mean, low, high = position_mean_ci(cos[:, times], resamples=opts.resamples_used, seed=opts.seed_used)
    return CosineResult(loaded.path, loaded.iteration, loaded.path.parent.name, cos, times, mean, low, high)


def _predict(model: torch.nn.Module, batch: Batch, decoding: str, chunk: int) -> torch.Tensor:
    """Argmax predictions (n, T): the standard model's :func:`predict`, a feedback model's decoded."""
    return predict(model, batch.inputs, chunk) if decoding == "none" else predict_decoded(model, batch, decoding, chunk)


def evaluate_checkpoint(loaded: Loaded, opts: AccuracyOptions, device: torch.device) -> AccuracyResult:
    """Predictions on the uniform held-out set and (if present) the frequency grid; a feedback
    model's under each decoding of :func:`decodings_for` (the first is the main one); an extended
    vocabulary's also per old and new target item."""
    task = make_task(loaded.config.task)
    decodings = decodings_for(loaded, opts)
    for name in ("resamples", "seed"):
        check(getattr(opts, name) is None, f"{name}: applies to vector tasks (reverse-continuous: the bootstrap of "
                                           f"the cosine similarity); {loaded.path} is a {loaded.config.task.name} "
                                           f"checkpoint; leave it out")
    corpus = [n for n, cls in TASKS.items() if cls.evaluation == "corpus"]
    check(opts.corpus is None or task.evaluation == "corpus",
          f"corpus: {loaded.path} is a {loaded.config.task.name} checkpoint; corpus applies to "
          f"{', '.join(corpus)} runs only")
    if task.evaluation == "corpus":  # perplexity on the corpus's test split
        check(opts.bins is None and not opts.grid, f"{'bins' if opts.bins is not None else 'grid'}: {loaded.path} "
                                                   f"has no frequency grid (an lm checkpoint's perplexity is binned by "
                                                   f"token frequency and position)")
        return evaluate_lm_checkpoint(loaded, device, opts.corpus)
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


@dataclass(frozen=True)
class AccuracyRun:
    """A finished accuracy evaluation over checkpoints; :meth:`to_xarray` gives the accuracy store's dataset."""

    config: RunConfig  # of the first checkpoint
    results: list[AccuracyResult] | list[CosineResult]
    options: AccuracyOptions
    command: str = ""
    device: str = "cpu"
    configs: tuple[dict[str, Any], ...] = ()  # each checkpoint's config attributes (config_attrs)

    def to_xarray(self) -> xr.Dataset:
        first = self.results[0] if self.results else None
        length = getattr(first, "grid_correct", None)
        options = {"bins": bins_arg(self.options.bins_for(None if length is None else length.shape[-1])),
                   "grid": self.options.grid,
                   "decoding": self.options.decoding}
        if self.results and isinstance(self.results[0], CosineResult):
            options = {"resamples": self.options.resamples_used, "seed": self.options.seed_used}
            ds = cosine_dataset(self.results, self.config, options, self.command, self.device)  # type: ignore[arg-type]
        else:
            ds = accuracy_dataset(self.results, self.config, options, self.command, self.device)  # type: ignore[arg-type]
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
            check((loaded.config.model.feedback, loaded.config.model.inputs) == (config.model.feedback,
                                                                                config.model.inputs),
                  f"checkpoint: {loaded.path} is a {'feedback' if loaded.config.model.feedback else 'standard'} model "
                  f"and the first is not; evaluate them separately")
        config = config or loaded.config
        vectors = TASKS[loaded.config.task.name].evaluation == "vectors"
        results.append(evaluate_vectors(loaded, opts, device) if vectors else evaluate_checkpoint(loaded, opts, device))
        configs.append(config_attrs(loaded.config))
        del loaded
        if on_progress is not None:
            on_progress(1)
    assert config is not None  # expand_checkpoints never returns an empty list
    return AccuracyRun(config, results, opts, command, device_label if device_label is not None else str(device),
                       tuple(configs))


def accuracy(source: Any, *, bins: int | tuple[int, ...] | None = None, grid: bool | None = None,
             device: str = "auto", batch_size: int = 1024, decoding: str = "both", resamples: int | None = None,
             seed: int | None = None,
             corpus: str | Path | None = None) -> xr.Dataset:
    """Accuracy on the held-out sets (SPEC §5) as an xarray Dataset with the variables of an accuracy
    store: token, sequence and Damerau–Levenshtein accuracy per checkpoint, and the frequency grid
    by target position when the checkpoint has one. Options are named as ``gradscope accuracy``'s flags.

    source: a checkpoint file or run directory (or a list of them: every checkpoint, oldest first),
    or a :class:`~gradscope.files.checkpoint.Loaded` (not read again). A model of your own has no
    held-out set: evaluate it in your own code.
    bins: the grid's target-position bins, a count or 0-based edges (None: 4, quarters); given for a
    checkpoint without a grid (or with grid=False), it is refused, not ignored.
    decoding: a feedback model's decodings (both, autoregressive, teacher). A vector task's store holds
    cosine similarity per position with bootstrap CIs (resamples, None: 10,000; seed, None: 0). An lm checkpoint's holds
    perplexity on its corpus's test split; ``corpus`` names that corpus's directory if it moved.
    """
    opts = AccuracyOptions(bins=bins, grid=grid, device=device, batch_size=batch_size, decoding=decoding,
                           resamples=resamples, seed=seed, corpus=None if corpus is None else str(corpus))
    return run_accuracy(checkpoint_sources(source), opts).to_xarray()
