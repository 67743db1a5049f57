"""Confidence intervals and permutation tests (scipy.stats, always seeded; docs/definitions.md §5; imported on first use).

The paper's unit is the training-test trial (five seeds), so samples are often tiny: with n = 5 a
nominal 95% percentile-bootstrap interval covered the true mean only ~86% of the time in a
normal-data simulation (BCa ~85%, Student-t ~96%). Intervals from fewer than `FEW_TRIALS` values
therefore carry a note saying so.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass

import numpy as np

from gradscope.errors import check
from gradscope.fields import CONFIDENCE, INTERVAL, INTERVALS, MAX_RESAMPLES, RESAMPLES  # declared with the options

METHODS = INTERVALS  # the interval methods, declared with the options
FEW_TRIALS = 10  # below this, bootstrap intervals under-cover noticeably (see module docstring)
MAX_ELEMENTS = 1 << 24  # resample values held at once (~128 MiB float64); bounds token-level resampling
# random rearrangements of a Monte Carlo permutation test (scipy's own default): the observed statistic
# counts among them, p = (k + 1) / (PERMUTATIONS + 1), so p-values are multiples of 1/10,000
PERMUTATIONS = 9_999


@dataclass(frozen=True)
class Interval:
    """Mean of the finite values with a confidence interval; n counts finite values, nan those left out.

    ``method`` is how the bounds were computed ("percentile", "bca", "basic", "t"), ``few`` whether
    n < FEW_TRIALS, ``note`` says why bounds are degenerate or NaN, or warns about few trials.
    """

    mean: float
    low: float
    high: float
    n: int
    nan: int
    note: str = ""
    method: str = INTERVAL
    few: bool = False


def finite_values(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Flatten to float64 and drop NaN/±inf: (finite values (n,), how many were dropped)."""
    values = np.asarray(values, dtype=np.float64).ravel()
    finite = values[np.isfinite(values)]
    return finite, int(values.size - finite.size)


def check_resamples(resamples: int) -> None:
    """1 <= resamples <= MAX_RESAMPLES (more would run for hours without changing the interval)."""
    check(isinstance(resamples, numbers.Integral) and not isinstance(resamples, bool) and 1 <= resamples <= MAX_RESAMPLES,
          f"resamples: got {resamples!r}; expected a number of bootstrap resamples between 1 and {MAX_RESAMPLES}")


def check_seed(seed: int) -> None:
    """A generator seed: an integer in 0 … 2**63 − 1."""
    check(isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and 0 <= seed < 2**63,
          f"seed: got {seed!r}; it must be an integer between 0 and {2**63 - 1}")


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def confidence_interval(values: np.ndarray, *, method: str = INTERVAL, confidence: float = CONFIDENCE,
                        resamples: int = RESAMPLES, seed: int = 0) -> Interval:
    """Mean of a sample (any shape, flattened to (n,)) and a two-sided confidence interval for it.

    "percentile", "bca", "basic": scipy.stats.bootstrap with ``resamples`` resamples drawn from
    np.random.default_rng(seed); "t": the Student-t interval mean ± t_{n−1} · sd / √n (no
    resampling; better coverage for a handful of trials). NaNs are counted in ``nan`` and excluded.
    All-equal values give [v, v] with a note (scipy would return NaN); fewer than two values give
    NaN bounds with a note.
    """
    from scipy import stats  # on first use: importing scipy.stats adds ~0.75 s to every start-up

    check(method in METHODS, f"method: got {method!r}; valid values are {', '.join(METHODS)}")
    check(0 < confidence < 1, f"confidence: got {confidence}; expected a level strictly between 0 and 1")
    check_resamples(resamples)
    check_seed(seed)
    finite, nan = finite_values(values)
    n = int(finite.size)
    few = n < FEW_TRIALS
    few_note = (f"few trials (n={n}): {method} bootstrap intervals under-cover; consider the t method"
                if few and method != "t" else "")
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, nan, "no finite values", method, True)
    mean = float(finite.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n, nan, "one value: no interval", method, True)
    if np.all(finite == finite[0]):
        return Interval(mean, mean, mean, n, nan, _join("all values equal: degenerate interval", few_note),
                        method, few)
    if method == "t":
        sem = float(finite.std(ddof=1)) / math.sqrt(n)
        half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sem
        return Interval(mean, mean - half, mean + half, n, nan, few_note, method, few)
    batch = max(1, MAX_ELEMENTS // n) if n * resamples > MAX_ELEMENTS else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = stats.bootstrap((finite,), np.mean, confidence_level=confidence, n_resamples=resamples,
                              batch=batch, method=method, vectorized=True, rng=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    bad = "" if math.isfinite(low) and math.isfinite(high) else f"scipy's {method} interval is undefined here"
    return Interval(mean, low, high, n, nan, _join(bad, few_note), method, few)


def bootstrap_mean(values: np.ndarray, *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0,
                   method: str = INTERVAL) -> Interval:
    """Mean and bootstrap CI of a sample; `confidence_interval` with the bootstrap as default."""
    return confidence_interval(values, method=method, confidence=confidence, resamples=resamples, seed=seed)


# --- permutation tests --------------------------------------------------------------------------

@dataclass(frozen=True)
class PermutationResult:
    """Two-sided permutation test of a difference in means, a − b.

    mean_diff: mean(a) − mean(b) (paired: mean of a_i − b_i). effect_size: Cohen's d_z = mean
    difference / sd of the differences (paired) or Cohen's d = difference / pooled sd (unpaired),
    both with ddof 1, NaN where that sd is 0. n_a, n_b: finite values used (pairs: n_a = n_b);
    nan: values left out (a pair goes if either member is NaN). exact: all ``permutations``
    rearrangements were enumerated; then min_pvalue = 2 / permutations is the smallest p attainable.
    """

    mean_diff: float
    effect_size: float
    effect_name: str
    pvalue: float
    n_a: int
    n_b: int
    nan: int
    paired: bool
    exact: bool
    permutations: int
    min_pvalue: float
    note: str = ""


def _mean_diff_paired(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x - y, axis=axis)


def _mean_diff(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else math.nan


def _run(data: tuple[np.ndarray, np.ndarray], statistic, permutation_type: str, permutations: int,
         resamples: int, seed: int) -> tuple[float, bool, int, float, str]:
    """(pvalue, exact, size of the null distribution, min attainable p, note) from scipy."""
    from scipy import stats  # on first use: importing scipy.stats adds ~0.75 s to every start-up

    exact = permutations <= resamples
    res = stats.permutation_test(data, statistic, permutation_type=permutation_type, vectorized=True,
                                 n_resamples=resamples, alternative="two-sided", rng=np.random.default_rng(seed))
    size = int(res.null_distribution.size)
    if exact:
        min_p = min(1.0, 2 / size)
        note = f"exact: all {size} rearrangements; smallest attainable p = {min_p:.4g}"
        if min_p > 0.05:
            note += " (p < 0.05 is impossible with this few trials)"
    else:
        min_p = 2 / (resamples + 1)  # scipy counts the observed statistic among the resamples
        note = f"Monte Carlo: {resamples} random rearrangements of {permutations}"
    return float(res.pvalue), exact, size, min_p, note


def paired_permutation_test(a: np.ndarray, b: np.ndarray, *, seed: int = 0,
                            resamples: int = PERMUTATIONS) -> PermutationResult:
    """Paired two-sided permutation (sign-flip) test of mean(a − b) = 0, e.g. PE vs vanilla at equal seeds.

    a, b (n,) values of the same n units (pair i = seed i). scipy.stats.permutation_test with
    permutation_type="samples" swaps a_i and b_i within pairs; with 2^n ≤ resamples it enumerates
    all 2^n sign flips (exact; with 5 pairs only 32, so p ≥ 2/32 = 0.0625).
    """
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    check(a.shape == b.shape, f"b: got {b.size} values; a paired test needs as many as a ({a.size})")
    keep = np.isfinite(a) & np.isfinite(b)
    a, b, nan = a[keep], b[keep], int(keep.size - keep.sum())
    n = int(a.size)
    if n == 0:
        return PermutationResult(math.nan, math.nan, "d_z", math.nan, 0, 0, nan, True, False, 0, math.nan,
                                 "no complete pairs")
    d = a - b
    mean_diff = float(d.mean())
    effect = _ratio(mean_diff, float(d.std(ddof=1))) if n > 1 else math.nan
    p, exact, size, min_p, note = _run((a, b), _mean_diff_paired, "samples", 2 ** n, resamples, seed)
    return PermutationResult(mean_diff, effect, "d_z", p, n, n, nan, True, exact, size, min_p, note)


def permutation_test(a: np.ndarray, b: np.ndarray, *, seed: int = 0,
                     resamples: int = PERMUTATIONS) -> PermutationResult:
    """Unpaired two-sided permutation test of mean(a) = mean(b) for independent groups (sizes may differ).

    scipy.stats.permutation_test with permutation_type="independent" reassigns the pooled values to
    groups of the original sizes; exact when C(n_a + n_b, n_a) ≤ resamples (5 vs 5: 252, p ≥ 0.0079).
    """
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    fa, fb = a[np.isfinite(a)], b[np.isfinite(b)]
    nan = int(a.size - fa.size + b.size - fb.size)
    n_a, n_b = int(fa.size), int(fb.size)
    if n_a == 0 or n_b == 0:
        return PermutationResult(math.nan, math.nan, "d", math.nan, n_a, n_b, nan, False, False, 0, math.nan,
                                 "a group has no finite values")
    mean_diff = float(fa.mean() - fb.mean())
    dof = n_a + n_b - 2
    pooled = math.sqrt(((n_a - 1) * fa.var(ddof=1 if n_a > 1 else 0) + (n_b - 1) * fb.var(ddof=1 if n_b > 1 else 0))
                       / dof) if dof > 0 else 0.0
    effect = _ratio(mean_diff, pooled)
    p, exact, size, min_p, note = _run((fa, fb), _mean_diff, "independent", math.comb(n_a + n_b, n_a), resamples,
                                       seed)
    return PermutationResult(mean_diff, effect, "d", p, n_a, n_b, nan, False, exact, size, min_p, note)
