"""`gradscope accuracy`: evaluate checkpoints on their held-out sets (docs/definitions.md §5)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import xarray as xr

from gradscope.workflows.options import DEVICE_LABEL
from gradscope.config import RunConfig
from gradscope.errors import check
from gradscope.files.checkpoint import Loaded
from gradscope.store.parts import record_checkpoint_configs
from gradscope.tasks import TASKS
from gradscope.train.device import resolve_device
from gradscope.workflows.common import config_attrs, expand_checkpoints, load_source
from gradscope.workflows.families.registry import check_options, evaluation_of
from gradscope.workflows.options import AccuracyOptions  # declared there, torch-free (a command's --help)


@dataclass(frozen=True)
class AccuracyRun:
    """A finished accuracy evaluation over checkpoints; :meth:`to_xarray` gives the accuracy store's dataset."""

    config: RunConfig  # of the first checkpoint
    results: list[Any]  # each checkpoint's, as its family's evaluation gives them (gradscope.workflows.families.registry)
    options: AccuracyOptions
    command: str = ""
    device: str = DEVICE_LABEL
    configs: tuple[dict[str, Any], ...] = ()  # each checkpoint's config attributes (config_attrs)

    def to_xarray(self) -> xr.Dataset:
        evaluation = evaluation_of(TASKS[self.config.task.name])
        ds = evaluation.dataset(self.results, self.config, self.options, self.command, self.device)
        return record_checkpoint_configs(ds, self.configs)


def run_checkpoint_accuracy(paths: list[Path | Loaded], opts: AccuracyOptions, *,
                            on_start: Callable[[int], None] | None = None,
                            on_progress: Callable[[int], None] | None = None, command: str = "",
                            device_label: str | None = None) -> AccuracyRun:
    """Evaluate every checkpoint (run directories expand to all their checkpoints, oldest first),
    loading one at a time (a :class:`Loaded` is used as it is), as its task family's evaluation
    (:func:`gradscope.workflows.families.registry.evaluation_of`) does."""
    opts = dataclasses.replace(opts, batch_size=opts.batch_used)  # an evaluation reads a number of sequences
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
        evaluation = evaluation_of(TASKS[loaded.config.task.name])  # the family's own (default: tokens)
        check_options(loaded, opts, evaluation)
        results.append(evaluation.evaluate(loaded, opts, device))
        configs.append(config_attrs(loaded.config))
        del loaded
        if on_progress is not None:
            on_progress(1)
    assert config is not None  # expand_checkpoints never returns an empty list
    return AccuracyRun(config, results, opts, command, device_label if device_label is not None else str(device),
                       tuple(configs))
