"""The continuous task's accuracy (paper App. B.3): cosine similarity against a hand computation, and the
bootstrap interval of its mean per position against scipy's."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gradscope.analysis.cosine import cosine_similarity, position_mean_ci


def test_cosine_similarity_by_hand() -> None:
    preds = torch.tensor([[[3.0, 4.0], [1.0, 0.0], [0.0, 0.0]]])  # (1, 3, 2)
    targets = torch.tensor([[[0.6, 0.8], [-1.0, 1.0], [1.0, 0.0]]])
    nan = float("nan")
    targets_unscored = torch.tensor([[[nan, nan], [-1.0, 1.0], [1.0, 0.0]]])
    # (3·0.6 + 4·0.8) / (5 · 1) = 1;  (−1) / (1 · √2);  a zero prediction has no direction
    got = cosine_similarity(preds, targets)
    assert got[0, 0] == pytest.approx(1.0, abs=1e-15) and got[0, 1] == pytest.approx(-1 / math.sqrt(2), abs=1e-15)
    assert math.isnan(got[0, 2])
    assert math.isnan(cosine_similarity(preds, targets_unscored)[0, 0])


def test_position_ci_matches_scipy_and_brackets_the_mean() -> None:
    from scipy import stats

    values = np.random.default_rng(3).normal(0.5, 0.1, size=(64, 3))
    mean, low, high = position_mean_ci(values, resamples=2000, seed=4)
    np.testing.assert_allclose(mean, values.mean(0), rtol=1e-12)
    ref = stats.bootstrap((values[:, 1],), np.mean, n_resamples=2000, method="percentile",
                          rng=np.random.default_rng(4)).confidence_interval
    assert np.all(low < mean) and np.all(mean < high)
    assert abs(low[1] - ref.low) < 0.01 and abs(high[1] - ref.high) < 0.01  # same bootstrap, other resample draws
    assert np.isnan(position_mean_ci(np.ones((5, 2)))[1]).all()  # all equal: no interval
