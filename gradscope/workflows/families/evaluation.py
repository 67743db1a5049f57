"""What a task family's evaluation is: how one checkpoint of it is evaluated, which of the accuracy
options it reads, how its results become the accuracy store's dataset, and (a family probed on its own
text) its probe source for stability and dynamics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import xarray as xr

from gradscope.config import RunConfig
from gradscope.files.checkpoint import Loaded
from gradscope.workflows.options import AccuracyOptions


@dataclass(frozen=True, kw_only=True)
class TextProbes:
    """A family whose stability and dynamics probes are its corpus's own text, not generated phases
    (the lm family). Declared here only: the task class below says nothing of it.

    label: the condition label of the text around a target (disturbants are real text); groups: the
    default target classes; task(loaded, opts) → the checkpoint's task (opts: the command's options, of which
    it reads its family's own, such as a moved corpus's directory);
    probes(task, n, position, length, groups, seed) → stability's triplets; sequences(task, n, seed) →
    dynamics' rows; token_classes(tokens, task) → each step's class; trajectories(model, task, steps, n,
    seed) → the Lyapunov trajectories' tokens; options: the stability and dynamics options only this probe source
    reads (given for a checkpoint of another family, each is refused, not ignored)."""

    label: str
    groups: tuple[str, ...]
    task: Callable[..., Any]
    probes: Callable[..., Any]
    sequences: Callable[..., torch.Tensor]
    token_classes: Callable[..., Any]
    trajectories: Callable[..., torch.Tensor]
    options: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """A family's evaluation (gradscope.workflows.families.registry.EVALUATIONS).

    options: the :class:`AccuracyOptions` fields of its own it reads (any other family's option given
    for one of its checkpoints is refused, not ignored); evaluate: one checkpoint → its result (the
    model goes to ``device`` and back to the CPU); dataset: every checkpoint's result, in order → the
    accuracy store's variables, coordinates and attributes (the options it reads recorded in them);
    text_probes: its probe source where stability and dynamics probe it on its own text, else None."""

    options: tuple[str, ...]
    evaluate: Callable[[Loaded, AccuracyOptions, torch.device], Any]
    dataset: Callable[[Sequence[Any], RunConfig, AccuracyOptions, str, str], xr.Dataset]
    text_probes: TextProbes | None = None
