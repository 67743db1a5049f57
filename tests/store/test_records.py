"""The records stores hold and workflows produce (``gradscope.store.records``): an evaluation's ratios derived
from its exact counts, written out here (NaN where nothing was scored, never 0 or 1); records are frozen,
and what they leave out defaults to nothing, never to a value shared between records."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from gradscope.analysis.bootstrap import Interval
from gradscope.analysis.stability import StabilityResult
from gradscope.store.records import (AccuracyResult, CheckpointResult, FamilyResult, SummaryEntry, TrainingComparison,
                                     TrainingPoint, TrialRecord)


def _accuracy(correct: list[int], scored: list[int], dl: list[float]) -> AccuracyResult:
    zeros = np.zeros(4, dtype=np.int64)
    return AccuracyResult(Path("step-10.pt"), 10, "run", np.array(correct), np.array(scored), np.array(dl),
                          zeros, zeros)


def test_token_accuracy_is_right_over_scored_tokens() -> None:
    assert _accuracy([3, 1, 0], [4, 4, 2], [0, 1, 2]).token_accuracy == pytest.approx(4 / 10)
    assert _accuracy([4, 4], [4, 4], [0, 0]).token_accuracy == 1.0
    assert _accuracy([0, 0], [4, 4], [1, 1]).token_accuracy == 0.0
    assert math.isnan(_accuracy([0, 0], [0, 0], [0, 0]).token_accuracy)  # nothing scored: NaN, not 0


def test_sequence_accuracy_counts_whole_sequences_among_those_scored() -> None:
    assert _accuracy([4, 1, 2], [4, 4, 2], [0, 1, 0]).sequence_accuracy == pytest.approx(2 / 3)
    # a sequence with nothing scored is left out (0 of 0 is no full match, and no miss either)
    assert _accuracy([4, 0, 0], [4, 0, 3], [0, 0, 1]).sequence_accuracy == pytest.approx(1 / 2)
    assert _accuracy([4, 0], [4, 0], [0, 0]).sequence_accuracy == 1.0
    assert math.isnan(_accuracy([0, 0], [0, 0], [0, 0]).sequence_accuracy)  # no sequence scored: NaN, not 1


def test_dl_distance_is_the_mean_over_every_sequence() -> None:
    assert _accuracy([3, 1, 0], [4, 4, 0], [1, 3, 2]).dl_distance == pytest.approx(2.0)
    assert math.isnan(_accuracy([], [], []).dl_distance)  # no sequence at all


def test_the_ratios_are_plain_floats() -> None:
    result = _accuracy([3, 1], [4, 4], [0, 1])
    for value in (result.token_accuracy, result.sequence_accuracy, result.dl_distance):
        assert type(value) is float


def test_records_are_frozen() -> None:
    interval = Interval(0.5, 0.4, 0.6, 3, 0)
    stability = StabilityResult({}, {}, torch.zeros(3, 1, 1), None, None)
    records = [
        _accuracy([1], [1], [0]),
        CheckpointResult(Path("a.pt"), 1, "run", stability),
        FamilyResult(Path("a.pt"), 1, "run", {"n": np.ones(2)}),
        TrialRecord(Path("s.zarr"), "accuracy", {"core": "gru"}, 1, {"token_accuracy": 0.5}),
        SummaryEntry(("gru",), "GRU", "token_accuracy", interval, (1,), (0.5,)),
        TrainingPoint(10, interval, (1, 2), (0.1, 0.2)),
        TrainingComparison("GRU", "token_accuracy", "none", "sinusoidal", (), None, None, None),
    ]
    for record in records:
        first = dataclasses.fields(record)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, first, None)


def test_what_a_record_leaves_out_is_nothing_and_never_shared() -> None:
    a, b = _accuracy([1], [1], [0]), _accuracy([1], [1], [0])
    assert a.family == {} and a.family is not b.family
    assert a.decodings == () and a.decoded_time_correct is None and a.decoded_time_scored is None
    for name in ("grid_correct", "grid_total", "grid_bin_correct", "grid_bin_total", "item_time_correct",
                 "item_time_scored", "grid_item_correct", "grid_item_total"):
        assert getattr(a, name) is None, name
    t, u = (TrialRecord(Path("s.zarr"), "accuracy", {}, 1, {}) for _ in range(2))
    assert (t.units, t.nan_units, t.iteration) == ({}, {}, None)
    assert t.units is not u.units and t.nan_units is not u.nan_units
    entry = SummaryEntry(("gru",), "GRU", "token_accuracy", Interval(0.5, 0.4, 0.6, 3, 0), (1,), (0.5,))
    assert entry.nan_units == 0
    assert TrainingComparison("GRU", "m", "a", "b", (), None, None, None).note == ""
