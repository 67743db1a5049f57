"""What a task family's evaluation is: how one checkpoint of it is evaluated, which of the accuracy
options it reads, and how its results become the accuracy store's dataset."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import xarray as xr

from gradscope.config import RunConfig
from gradscope.files.checkpoint import Loaded
from gradscope.workflows.options import AccuracyOptions


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """A family's evaluation (gradscope.workflows.families.EVALUATIONS).

    options: the :class:`AccuracyOptions` fields of its own it reads (any other family's option given
    for one of its checkpoints is refused, not ignored); evaluate: one checkpoint → its result (the
    model goes to ``device`` and back to the CPU); dataset: every checkpoint's result, in order → the
    accuracy store's variables, coordinates and attributes (the options it reads recorded in them)."""

    options: tuple[str, ...]
    evaluate: Callable[[Loaded, AccuracyOptions, torch.device], Any]
    dataset: Callable[[Sequence[Any], RunConfig, AccuracyOptions, str, str], xr.Dataset]
