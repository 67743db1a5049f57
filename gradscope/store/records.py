"""The records that stores hold and that workflows produce: plain dataclasses of numbers, with no
xarray, so every layer above the store can build and read them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gradscope.analysis.bootstrap import Interval
from gradscope.analysis.stability import StabilityResult
from gradscope.analysis.trend import TrendTest


@dataclass(frozen=True)
class CheckpointResult:
    """One checkpoint's stability: where it came from, and its per-triplet results."""

    path: Path
    iteration: int
    run: str
    result: StabilityResult


@dataclass(frozen=True)
class AccuracyResult:
    """One checkpoint's evaluation. Counts are exact integers; ratios are derived from them.

    sequence_correct / sequence_scored (n,): scored tokens right / scored per held-out sequence;
    sequence_dl (n,): Damerau–Levenshtein distance per sequence; time_correct / time_scored (T,);
    grid_correct / grid_total (2, 2, L) and their binned versions (2, 2, bins), or None;
    family: the task family's own counts (:meth:`gradscope.tasks.base.Task.score`, or its own
    evaluation's: gradscope.workflows.families), stored as its family declares
    (:meth:`~gradscope.tasks.base.Task.accuracy_part`).
    """

    path: Path
    iteration: int
    run: str
    sequence_correct: np.ndarray
    sequence_scored: np.ndarray
    sequence_dl: np.ndarray
    time_correct: np.ndarray
    time_scored: np.ndarray
    grid_correct: np.ndarray | None = None
    grid_total: np.ndarray | None = None
    grid_bin_correct: np.ndarray | None = None
    grid_bin_total: np.ndarray | None = None
    family: dict[str, np.ndarray] = field(default_factory=dict)
    # a feedback model (paper App. B.2): the decodings evaluated, the first being the one above, and
    # per decoding the counts per time (len(decodings), T)
    decodings: tuple[str, ...] = ()
    decoded_time_correct: np.ndarray | None = None
    decoded_time_scored: np.ndarray | None = None
    # an extended vocabulary (paper §4.2): counts per time for old and new target items (2, T), and
    # on the grid per (target group, disturbant group, item, target position) (2, 2, 2, L)
    item_time_correct: np.ndarray | None = None
    item_time_scored: np.ndarray | None = None
    grid_item_correct: np.ndarray | None = None
    grid_item_total: np.ndarray | None = None

    @property
    def token_accuracy(self) -> float:
        """Scored tokens right / scored tokens; NaN when nothing was scored."""
        scored = int(self.sequence_scored.sum())
        return float(self.sequence_correct.sum() / scored) if scored else float("nan")

    @property
    def sequence_accuracy(self) -> float:
        """Full-match rate over the sequences with a scored token; NaN when there is none."""
        has = self.sequence_scored > 0
        return float((self.sequence_correct[has] == self.sequence_scored[has]).mean()) if has.any() else float("nan")

    @property
    def dl_distance(self) -> float:
        return float(self.sequence_dl.mean()) if self.sequence_dl.size else float("nan")


@dataclass(frozen=True)
class FamilyResult:
    """One checkpoint's evaluation by a task family whose accuracy store is its own part alone (its
    ``token_part`` is False, e.g. vector outputs): its counts, stored as the family declares
    (:meth:`~gradscope.tasks.base.Task.accuracy_part`)."""

    path: Path
    iteration: int
    run: str
    family: dict[str, np.ndarray]


@dataclass(frozen=True)
class TrialRecord:
    """One store = one trial: its config fields (as strings), seed, metric values, unit values and,
    per metric, how many units were NaN (left out of the metric's value, counted here); ``iteration``:
    the training iteration of the checkpoint the values come from (None where not recorded)."""

    path: Path
    kind: str
    fields: dict[str, str]
    seed: int
    metrics: dict[str, float]
    units: dict[str, np.ndarray] = field(default_factory=dict)
    nan_units: dict[str, int] = field(default_factory=dict)
    iteration: int | None = None


@dataclass(frozen=True)
class SummaryEntry:
    """One group × metric: the interval over its trials (``interval.nan`` trials were NaN), the
    per-seed values, and ``nan_units``: units (triplets, sequences) of its trials that were NaN,
    left out of the trials' values and counted here (never averaged in silently)."""

    group: tuple[str, ...]
    label: str
    metric: str
    interval: Interval
    seeds: tuple[int, ...]
    values: tuple[float, ...]
    nan_units: int = 0




@dataclass(frozen=True)
class TrainingPoint:
    """One checkpoint of a comparison over training: the interval of the per-seed differences b − a at
    ``iteration``, the seeds paired there and their differences."""

    iteration: int
    interval: Interval
    seeds: tuple[int, ...]
    differences: tuple[float, ...]


@dataclass(frozen=True)
class TrainingComparison:
    """Two arms (``a``, ``b``: the values of the compared field) over training, within one group of the
    other fields (``label``), for one metric: the seed-level difference at every checkpoint, and the
    test of whether it opens between the ``first`` and ``last`` iteration every seed pair has
    (``test`` is None where fewer than two such iterations exist; ``note`` says why)."""

    label: str
    metric: str
    a: str
    b: str
    points: tuple[TrainingPoint, ...]
    first: int | None
    last: int | None
    test: TrendTest | None
    note: str = ""
