"""The test of whether a gap between two arms opens with training (gradscope.analysis.trend).

References: scipy's t distribution and one-sample t-test called directly, brute-force enumeration of
the 2^n sign flips, and hand-made gaps for each outcome of the rule.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from gradscope.analysis.bootstrap import Interval
from gradscope.analysis.trend import VERDICTS, seed_statistic, trend_test, verdict
from gradscope.errors import GradscopeError


def _iv(low: float, high: float) -> Interval:
    return Interval((low + high) / 2, low, high, 5, 0, method="t")


def test_seed_statistic_matches_scipy_and_brute_force_sign_flips() -> None:
    x = np.array([0.165, -0.028, 0.07, 0.12, -0.01])
    st = seed_statistic(x, resamples=2000, seed=3)
    n, mean, sem = x.size, x.mean(), x.std(ddof=1) / math.sqrt(x.size)
    half = stats.t.ppf(0.975, n - 1) * sem
    assert st.t.mean == pytest.approx(mean, abs=1e-15)
    assert (st.t.low, st.t.high) == pytest.approx((mean - half, mean + half), abs=1e-12)
    assert st.t_p == pytest.approx(stats.ttest_1samp(x, 0.0).pvalue, rel=1e-12)
    flips = np.array([np.mean(x * np.array(signs)) for signs in itertools.product((1, -1), repeat=n)])
    brute = np.mean(np.abs(flips) >= abs(mean) - 1e-12)
    assert st.sign_p == pytest.approx(brute, abs=1e-12)
    assert st.bootstrap.method == "percentile" and st.bootstrap.low < mean < st.bootstrap.high


@pytest.mark.parametrize(("gap", "change", "margin", "expected"), [
    ((0.01, 0.2), (0.05, 0.4), 0.05, "opens"),
    ((-0.2, -0.01), (-0.3, -0.02), 0.05, "opposite"),
    ((-0.03, 0.04), (-0.05, 0.05), 0.05, "no effect"),
    ((-0.03, 0.04), (-0.06, 0.05), 0.05, "not settled"),   # change leaves the margin
    ((0.01, 0.2), (-0.1, 0.4), 0.05, "not settled"),       # ahead at the end, but not shown to grow
    ((0.01, 0.2), (-0.3, -0.02), 0.05, "not settled"),     # the two disagree
    ((-0.03, 0.04), (-0.05, 0.05), 0.0, "not settled"),    # no equivalence claim without a margin
])
def test_verdict_rule(gap: tuple, change: tuple, margin: float, expected: str) -> None:
    assert verdict(_iv(*gap), _iv(*change), margin) == expected
    assert expected in VERDICTS


def test_trend_test_outcomes_from_gaps() -> None:
    first = np.array([-0.05, 0.0, -0.02, 0.01, -0.03])
    opens = trend_test(first, first + np.array([0.2, 0.25, 0.22, 0.18, 0.3]), resamples=500)
    assert opens.verdict == "opens"
    assert opens.changes == pytest.approx((0.2, 0.25, 0.22, 0.18, 0.3))
    assert opens.gaps == pytest.approx(tuple(first + np.array([0.2, 0.25, 0.22, 0.18, 0.3])))
    opposite = trend_test(-first, -first - np.array([0.2, 0.25, 0.22, 0.18, 0.3]), resamples=500)
    assert opposite.verdict == "opposite"
    flat = np.array([0.003, -0.002, 0.001, -0.004, 0.002, 0.0, -0.001, 0.001])
    none = trend_test(flat, flat + np.array([0.002, -0.003, 0.001, 0.0, -0.001, 0.002, -0.002, 0.001]),
                      resamples=500)
    assert none.verdict == "no effect"
    # a significant but tiny gap is "opens" by the rule as written (both intervals above 0)
    tiny = trend_test(np.zeros(5), np.array([0.001, 0.002, 0.0015, 0.001, 0.002]), resamples=500)
    assert tiny.verdict == "opens"
    # two seeds that disagree, as seeds 1 and 2 of the Figure 5 runs did: nothing is settled
    split = trend_test(np.array([-0.077, 0.008]), np.array([0.165, -0.028]), resamples=500)
    assert split.verdict == "not settled"


def test_trend_test_nan_seed_left_out_and_counted() -> None:
    first = np.array([0.0, 0.0, 0.0, np.nan])
    last = np.array([0.1, 0.2, 0.15, 0.3])
    t = trend_test(first, last, resamples=200)
    assert t.gap.t.n == 4 and t.change.t.n == 3 and t.change.t.nan == 1


def test_trend_test_refuses_bad_input() -> None:
    with pytest.raises(GradscopeError, match="margin"):
        trend_test(np.zeros(3), np.ones(3), margin=float("nan"))
    with pytest.raises(GradscopeError, match="margin"):
        trend_test(np.zeros(3), np.ones(3), margin=-0.1)
    with pytest.raises(GradscopeError, match="last"):
        trend_test(np.zeros(3), np.ones(4))
    with pytest.raises(GradscopeError, match="confidence"):
        trend_test(np.zeros(3), np.ones(3), confidence=1.0)
