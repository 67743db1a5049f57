"""What a task family declares to the layers above it.

A family is its task class (one file, one line in :mod:`gradscope.tasks.registry`). Beside how its
batches and held-out sets are made (:class:`~gradscope.tasks.base.Task`) and its probe source
(``probes``; a family probed on its own text declares that on its evaluation,
:class:`gradscope.workflows.families.evaluation.TextProbes`), the class declares:

- ``layout``: the variables and coordinates it adds to an accuracy store, with their dims and kinds
  (the store's schema check reads them: :mod:`gradscope.store.schema`);
- ``score(batch, preds)``: its counts for one checkpoint, from the predictions on its held-out set;
- ``accuracy_part(counts)``: those counts over checkpoints → its store variables and coordinates;
- ``summary_metrics(last)``: the metrics `gradscope summarize` reads from its variables, with their
  units for bootstrap intervals;
- ``lines(last)``: what `gradscope accuracy` prints of them;
- ``report``: its section of the HTML report, as panels of its variables.

Everything here is numbers (numpy, torch): no xarray, no plotting, so a family stays below the store
and report layers, which loop over what the registered families declare and never name one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

FLOAT, INT, COUNT, STR = "float", "int", "count", "str"  # a variable's kind (as the store schema names them)

# name → (dims, values): what xarray.Dataset takes for a variable or a coordinate
Part = dict[str, tuple[tuple[str, ...], np.ndarray] | np.ndarray]
Metrics = tuple[dict[str, float], dict[str, np.ndarray]]  # metric → value, metric → per-unit values


@dataclass(frozen=True, kw_only=True)
class Variable:
    """One variable (or coordinate) of a family's part of the accuracy store."""

    dims: tuple[str, ...]
    kind: str  # FLOAT, INT, COUNT or STR
    help: str = ""


@dataclass(frozen=True, kw_only=True)
class Panel:
    """One panel of a family's report section: ``variable`` over ``("checkpoint", split, x)`` (or
    ``("checkpoint", x)`` when ``split`` is None) at the report's checkpoint, against ``x``; one line per
    configuration and value of ``split``, the mean over its stores (seeds), with bars from the lowest
    to the highest seed (a configuration of one store with ``bounds``: that store's own interval)."""

    variable: str
    x: str
    split: str | None = None
    title: str = ""
    x_title: str = ""
    y_title: str = "accuracy"
    log_y: bool = False  # a log-scale y axis (perplexities)
    x_only: str | None = None  # draw only the values of ``x`` whose label starts with this (lm: "decile")
    x_ticks: tuple[str, str] | None = None  # two coordinates over ``x`` labelling its ticks "first–last"
    bounds: tuple[str, str] | None = None  # a single store's own interval (low, high variables) as its bars


@dataclass(frozen=True, kw_only=True)
class ReportSection:
    """A family's section of the HTML report."""

    heading: str
    text: str
    panels: tuple[Panel, ...]

    def variables(self) -> tuple[str, ...]:
        return tuple(p.variable for p in self.panels)


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den as floats, NaN where den is 0 (nothing scored)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.maximum(den, 1), np.nan)


def stack(counts: list[Mapping[str, np.ndarray]], name: str) -> np.ndarray:
    """Checkpoints' counts of ``name``, stacked along a first (checkpoint) axis."""
    return np.stack([np.asarray(c[name]) for c in counts])


def units(correct: int, total: int) -> np.ndarray:
    """1/0 per scored token: the units a bootstrap interval of an accuracy resamples."""
    return np.repeat([1.0, 0.0], [int(correct), int(total) - int(correct)])


def perplexity(nll_sum: float | np.ndarray, n: int | np.ndarray) -> np.ndarray | float:
    """exp(nll_sum / n); NaN where n = 0 (nothing scored)."""
    nll_sum, n = np.asarray(nll_sum, dtype=np.float64), np.asarray(n)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(n > 0, np.exp(nll_sum / np.maximum(n, 1)), np.nan)
    return float(out) if out.ndim == 0 else out
