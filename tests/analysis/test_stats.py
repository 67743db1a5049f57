"""Accuracy, Damerau–Levenshtein distance, confidence intervals and permutation tests (SPEC §5).

References are independent: hand-made arrays with exact fractions, a brute-force unrestricted DL
(Lowrance–Wagner), scipy called directly on the same seed, and brute-force permutation enumeration.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from rapidfuzz.distance import OSA, Levenshtein
from scipy import stats

from gradscope.analysis.accuracy import (accuracy_by_length, binned_counts, binned_grid_accuracy, grid_counts,
                                         grid_target_accuracy, length_counts, position_accuracy, position_bins,
                                         position_counts, ratio, sequence_accuracy, token_accuracy)
from gradscope.analysis.bootstrap import (FEW_TRIALS, bootstrap_mean, confidence_interval, paired_permutation_test,
                                          permutation_test)
from gradscope.analysis.distance import dl_distances, scored_sequences, sequence_dl_distances
from gradscope.config import TaskConfig
from gradscope.errors import GradscopeError
from gradscope.tasks.base import IGNORE
from gradscope.tasks.reverse import Reverse
from gradscope.tasks.reverse_variable import ReverseVariable

X = IGNORE

# --- accuracy on hand-made arrays ---------------------------------------------------------------

PREDS = torch.tensor([[7, 7, 1, 2, 3],
                      [7, 7, 1, 0, 3]])
TARGETS = torch.tensor([[X, X, 1, 2, 3],
                        [X, X, 1, 2, 0]])


def test_token_position_sequence_accuracy_exact_fractions() -> None:
    assert token_accuracy(PREDS, TARGETS).item() == pytest.approx(4 / 6)
    assert sequence_accuracy(PREDS, TARGETS).item() == 0.5
    pos = position_accuracy(PREDS, TARGETS)
    assert torch.isnan(pos[:2]).all()
    assert pos[2:].tolist() == [1.0, 0.5, 0.5]
    correct, scored = position_counts(PREDS, TARGETS)
    assert correct.tolist() == [0, 0, 2, 1, 1] and scored.tolist() == [0, 0, 2, 2, 2]
    assert torch.equal(ratio(correct, scored).isnan(), pos.isnan())
    assert ratio(correct, scored)[2:].tolist() == [1.0, 0.5, 0.5]


def test_accuracy_by_length_hand_made() -> None:
    # row 0: length 1, right; row 1: length 2, one of two right; row 2: length 2, both right
    preds = torch.tensor([[0, 5, 0, 0], [0, 0, 3, 0], [0, 0, 1, 2]])
    targets = torch.tensor([[X, 5, X, X], [X, X, 3, 4], [X, X, 1, 2]])
    assert accuracy_by_length(preds, targets) == {1: 1.0, 2: 0.75}
    assert accuracy_by_length(preds, targets, kind="sequence") == {1: 1.0, 2: 0.5}
    # explicit lengths win over the scored count
    assert accuracy_by_length(preds, targets, torch.tensor([4, 2, 4])) == {2: 0.5, 4: 1.0}
    correct, total = length_counts(preds, targets)
    assert correct.tolist() == [0, 1, 3] and total.tolist() == [0, 1, 4]
    with pytest.raises(GradscopeError, match="kind"):
        accuracy_by_length(preds, targets, kind="row")


def test_accuracy_by_length_on_reverse_variable_rows() -> None:
    task = ReverseVariable(TaskConfig(name="reverse-variable", vocab_size=8, length=6, min_length=3))
    lengths = torch.tensor([3, 3, 5, 6])
    batch = task.format(torch.arange(24).reshape(4, 6) % 8, lengths)
    preds = batch.targets.clone()
    preds[0, 3] += 1  # the first output of the first length-3 row is wrong: 2 of 3 right
    preds[3, 11] += 1  # last output of the length-6 row
    assert torch.equal(ReverseVariable.lengths_of(batch), lengths)
    got = accuracy_by_length(preds, batch.targets, lengths)
    assert got == pytest.approx({3: 5 / 6, 5: 1.0, 6: 5 / 6})


# --- the dual-frequency grid --------------------------------------------------------------------

def grid_with_one_wrong_cell(length: int, n: int, p0: int, vocab: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """A raw grid (2, 2, N, L, L) and predictions (2, 2, N, L, 2L) right at every target recall
    except target position p0 of group (tg, dg) = (1, 0); every other output is wrong on purpose,
    so reading the wrong output index cannot look right."""
    gen = torch.Generator().manual_seed(0)
    grid = torch.randint(0, vocab, (2, 2, n, length, length), generator=gen)
    flat = Reverse(TaskConfig(vocab_size=vocab, length=length)).format(grid.reshape(-1, length)).targets
    preds = flat.reshape(2, 2, n, length, 2 * length).clone()
    preds = torch.where(preds == IGNORE, torch.randint(0, vocab, preds.shape, generator=gen), (preds + 1) % vocab)
    p = torch.arange(length)
    preds[..., p, 2 * length - 1 - p] = grid[..., p, p]  # the target recalls, right
    preds[1, 0, :, p0, 2 * length - 1 - p0] = (grid[1, 0, :, p0, p0] + 1) % vocab
    return grid, preds


def test_grid_indexing_exactly_one_cell_wrong() -> None:
    length, n, p0 = 12, 3, 4
    grid, preds = grid_with_one_wrong_cell(length, n, p0)
    expected = torch.ones(2, 2, length)
    expected[1, 0, p0] = 0.0
    acc = grid_target_accuracy(preds, grid)
    assert acc.shape == (2, 2, length)
    assert torch.equal(acc, expected)
    correct, total = grid_counts(preds, grid)
    assert torch.equal(total, torch.full((2, 2, length), n))
    assert torch.equal(correct, (expected * n).long())
    # update/compute: counts of chunks along N add up to the whole
    c1, t1 = grid_counts(preds[:, :, :1], grid[:, :, :1])
    c2, t2 = grid_counts(preds[:, :, 1:], grid[:, :, 1:])
    assert torch.equal(c1 + c2, correct) and torch.equal(t1 + t2, total)


def test_grid_binning_of_the_wrong_cell() -> None:
    length, n, p0 = 12, 3, 4  # 1-based position 5 lies in the second quarter, positions 4–6
    grid, preds = grid_with_one_wrong_cell(length, n, p0)
    binned = binned_grid_accuracy(grid_target_accuracy(preds, grid))
    expected = torch.ones(2, 2, 4)
    expected[1, 0, 1] = (3 - 1) / 3
    assert binned.shape == (2, 2, 4)
    torch.testing.assert_close(binned, expected)
    c, t = binned_counts(*grid_counts(preds, grid))
    assert t.tolist() == [[[9] * 4] * 2] * 2
    torch.testing.assert_close(ratio(c, t), expected)
    # explicit edges: one bin 1–4, one bin 5–12 holding the wrong position (7 of 8 right)
    two = binned_grid_accuracy(grid_target_accuracy(preds, grid), [0, 4, 12])
    assert two[1, 0].tolist() == pytest.approx([1.0, 7 / 8]) and (two[0] == 1).all() and (two[1, 1] == 1).all()


def test_grid_shape_errors() -> None:
    grid, preds = grid_with_one_wrong_cell(4, 2, 0)
    with pytest.raises(GradscopeError, match="preds"):
        grid_counts(preds.reshape(-1, 8), grid)


def test_position_bins() -> None:
    assert position_bins(64) == [(1, 16), (17, 32), (33, 48), (49, 64)]
    assert position_bins(64, [0, 16, 32, 48, 64]) == position_bins(64, 4)
    assert position_bins(10, 3) == [(1, 4), (5, 7), (8, 10)]
    assert position_bins(64, [0, 8, 64]) == [(1, 8), (9, 64)]
    assert position_bins(5, 5) == [(i, i) for i in range(1, 6)]
    for bad in (0, 65, [0], [0, 70], [8, 8, 16]):
        with pytest.raises(GradscopeError, match="bins"):
            position_bins(64, bad)


# --- Damerau–Levenshtein ------------------------------------------------------------------------

def brute_dl(a: list[int], b: list[int]) -> int:
    """Unrestricted Damerau–Levenshtein distance (Lowrance–Wagner), the textbook algorithm."""
    inf = len(a) + len(b)
    last_row: dict[int, int] = {}
    d = [[inf] * (len(b) + 2) for _ in range(len(a) + 2)]
    for i in range(len(a) + 1):
        d[i + 1][0], d[i + 1][1] = inf, i
    for j in range(len(b) + 1):
        d[0][j + 1], d[1][j + 1] = inf, j
    for i in range(1, len(a) + 1):
        last_col = 0
        for j in range(1, len(b) + 1):
            k, ell = last_row.get(b[j - 1], 0), last_col
            cost = 0 if a[i - 1] == b[j - 1] else 1
            if cost == 0:
                last_col = j
            d[i + 1][j + 1] = min(d[i][j] + cost, d[i + 1][j] + 1, d[i][j + 1] + 1,
                                  d[k][ell] + (i - k - 1) + 1 + (j - ell - 1))
        last_row[a[i - 1]] = i
    return d[len(a) + 1][len(b) + 1]


def test_dl_known_examples_on_ints() -> None:
    a, b, c = 0, 1, 2
    pred = [[a, b], [c, a], [10, 8, 19, 19, 4, 13], [], [5, 5]]  # "ab", "ca", "kitten"
    target = [[b, a], [a, b, c], [18, 8, 19, 19, 8, 13, 6], [], [5, 5]]  # "ba", "abc", "sitting"
    assert dl_distances(pred, target).tolist() == [1, 2, 3, 0, 0]
    assert Levenshtein.distance([a, b], [b, a]) == 2  # a transposition is one DL edit, two Levenshtein edits
    assert OSA.distance([c, a], [a, b, c]) == 3  # the restricted variant would give 3, not 2
    assert dl_distances([[1, 2]], [[1, 2, 3]], normalized=True).tolist() == pytest.approx([1 / 3])
    assert dl_distances(np.array([[1, 2, 3]]), torch.tensor([[3, 2, 1]])).tolist() == [2]
    assert dl_distances([], []).shape == (0,)
    with pytest.raises(GradscopeError, match="target_rows"):
        dl_distances([[1]], [[1], [2]])


def test_dl_matches_brute_force_on_random_int_sequences() -> None:
    rng = np.random.default_rng(0)
    pred = [rng.integers(0, 3, rng.integers(0, 8)).tolist() for _ in range(300)]
    target = [rng.integers(0, 3, rng.integers(0, 8)).tolist() for _ in range(300)]
    got = dl_distances(pred, target)
    assert got.dtype == np.int64
    assert got.tolist() == [brute_dl(p, t) for p, t in zip(pred, target)]


def test_scored_sequences_and_sequence_distances() -> None:
    preds = torch.tensor([[5, 5, 1, 2], [5, 3, 4, 9], [1, 1, 1, 1]])
    targets = torch.tensor([[X, X, 2, 1], [X, 4, 3, X], [X, X, X, 0]])
    pred_rows, target_rows = scored_sequences(preds, targets)
    assert pred_rows == [[1, 2], [3, 4], [1]] and target_rows == [[2, 1], [4, 3], [0]]
    assert sequence_dl_distances(preds, targets).tolist() == [1, 1, 1]
    assert sequence_dl_distances(preds, targets, normalized=True).tolist() == pytest.approx([0.5, 0.5, 1.0])


# --- confidence intervals -----------------------------------------------------------------------

@pytest.mark.parametrize("method", ["percentile", "bca", "basic"])
def test_bootstrap_bounds_equal_scipys_on_the_same_resamples(method: str) -> None:
    x = np.random.default_rng(3).normal(size=12)
    iv = confidence_interval(x, method=method, resamples=2000, seed=42)
    ref = stats.bootstrap((x,), np.mean, n_resamples=2000, method=method, vectorized=True,
                          rng=np.random.default_rng(42)).confidence_interval
    assert (iv.low, iv.high) == (ref.low, ref.high)
    assert iv.mean == x.mean() and iv.n == 12 and iv.nan == 0 and iv.method == method


def test_t_interval_equals_scipy_closed_form() -> None:
    x = np.array([0.61, 0.72, 0.55, 0.80, 0.66])
    iv = confidence_interval(x, method="t")
    low, high = stats.t.interval(0.95, 4, loc=x.mean(), scale=stats.sem(x))
    assert iv.low == pytest.approx(low, rel=1e-12) and iv.high == pytest.approx(high, rel=1e-12)


def test_seeds_reproduce_and_differ() -> None:
    x = np.random.default_rng(5).normal(size=20)
    a, b = confidence_interval(x, resamples=999, seed=1), confidence_interval(x, resamples=999, seed=1)
    c = confidence_interval(x, resamples=999, seed=2)
    assert (a.low, a.high) == (b.low, b.high)
    assert (a.low, a.high) != (c.low, c.high)
    # the wrapper the stability workflow calls is the same computation
    assert bootstrap_mean(x, seed=1, resamples=999) == a


def coverage(n: int, method: str, reps: int = 400, resamples: int = 999) -> float:
    """Fraction of `reps` seeded N(0, 1) samples of size n whose 95% interval holds the true mean 0."""
    rng = np.random.default_rng(2024)
    hits = 0
    for i in range(reps):
        iv = confidence_interval(rng.normal(size=n), method=method, resamples=resamples, seed=i)
        hits += iv.low <= 0.0 <= iv.high
    return hits / reps


def test_percentile_coverage_near_nominal_at_n30() -> None:
    """400 repetitions of n = 30 normal samples: coverage of a nominal 95% percentile interval must
    lie in [0.90, 0.99]. The binomial sd of a coverage estimate from 400 reps is
    sqrt(0.95 · 0.05 / 400) ≈ 0.011, and the percentile bootstrap is known to under-cover slightly at
    n = 30 (~93–94%), so the band is about ±4 sd around that; a wrong interval (e.g. SD instead of
    SE, or the wrong tail) lands far outside it."""
    assert 0.90 <= coverage(30, "percentile") <= 0.99


def test_t_interval_covers_better_than_percentile_at_n5() -> None:
    """With five trials the percentile bootstrap under-covers (~86% measured, FACTS) while the
    t-interval is exact for normal data (95%). 400 reps: sd ≈ 0.011–0.017 per estimate, so t ≥
    0.90, percentile ≤ 0.92 and a gap of at least 0.03 are loose bounds."""
    t, pct = coverage(5, "t"), coverage(5, "percentile")
    assert t >= 0.90 and pct <= 0.92 and t >= pct + 0.03


def test_degenerate_nan_and_tiny_samples() -> None:
    iv = confidence_interval(np.ones(12))
    assert (iv.mean, iv.low, iv.high, iv.n) == (1.0, 1.0, 1.0, 12) and "degenerate" in iv.note
    iv = confidence_interval(np.ones(5), method="bca")
    assert (iv.low, iv.high) == (1.0, 1.0) and "degenerate" in iv.note
    iv = confidence_interval(np.array([1.0, np.nan, 3.0, np.nan, 2.0]), method="t")
    assert (iv.n, iv.nan, iv.mean) == (3, 2, 2.0) and math.isfinite(iv.low)
    one = confidence_interval(np.array([0.5, np.nan]))
    assert one.n == 1 and one.nan == 1 and math.isnan(one.low) and math.isnan(one.high) and one.note
    none = confidence_interval(np.array([np.nan]))
    assert none.n == 0 and math.isnan(none.mean) and none.note
    with pytest.raises(GradscopeError, match="method"):
        confidence_interval(np.ones(3), method="normal")


def test_few_trials_note() -> None:
    x = np.arange(float(FEW_TRIALS))
    assert confidence_interval(x[:-1], resamples=99).few
    assert "few trials" in confidence_interval(x[:-1], resamples=99).note
    many = confidence_interval(x, resamples=99)
    assert not many.few and many.note == ""


# --- permutation tests --------------------------------------------------------------------------

def brute_paired_p(a: np.ndarray, b: np.ndarray) -> float:
    d = a - b
    null = [np.mean(d * s) for s in itertools.product([1, -1], repeat=d.size)]
    obs = d.mean()
    return min(1.0, 2 * min(np.mean(np.array(null) >= obs), np.mean(np.array(null) <= obs)))


def brute_unpaired_p(a: np.ndarray, b: np.ndarray) -> float:
    pooled = np.concatenate([a, b])
    null = []
    for idx in itertools.combinations(range(pooled.size), a.size):
        mask = np.zeros(pooled.size, bool)
        mask[list(idx)] = True
        null.append(pooled[mask].mean() - pooled[~mask].mean())
    obs = a.mean() - b.mean()
    return min(1.0, 2 * min(np.mean(np.array(null) >= obs), np.mean(np.array(null) <= obs)))


def test_paired_identical_groups() -> None:
    a = np.array([0.7, 0.8, 0.75, 0.9, 0.6])
    r = paired_permutation_test(a, a)
    assert r.pvalue == 1.0 and r.mean_diff == 0.0 and math.isnan(r.effect_size)


def test_paired_five_pairs_exact_minimum() -> None:
    b = np.array([0.70, 0.62, 0.81, 0.55, 0.74])
    a = b + np.array([0.05, 0.07, 0.04, 0.09, 0.06])  # PE better at every seed
    r = paired_permutation_test(a, b)
    assert r.exact and r.permutations == 32 and r.n_a == r.n_b == 5
    assert r.pvalue == pytest.approx(2 / 32, abs=1e-12) and r.min_pvalue == pytest.approx(2 / 32)
    assert "exact" in r.note and "impossible" in r.note
    d = a - b
    assert r.mean_diff == pytest.approx(d.mean()) and r.effect_size == pytest.approx(d.mean() / d.std(ddof=1))
    assert r.effect_name == "d_z"


def test_paired_matches_enumeration_and_drops_nan_pairs() -> None:
    rng = np.random.default_rng(9)
    a, b = rng.normal(size=7), rng.normal(size=7)
    assert paired_permutation_test(a, b).pvalue == pytest.approx(brute_paired_p(a, b), abs=1e-12)
    r = paired_permutation_test(np.append(a, np.nan), np.append(b, 1.0))
    assert (r.n_a, r.nan) == (7, 1) and r.pvalue == pytest.approx(brute_paired_p(a, b), abs=1e-12)
    with pytest.raises(GradscopeError, match="b"):
        paired_permutation_test(a, b[:-1])


def test_unpaired_five_vs_five_exact_minimum_and_enumeration() -> None:
    b = np.array([0.70, 0.62, 0.81, 0.55, 0.74])
    r = permutation_test(b + 1.0, b)
    assert r.exact and r.permutations == 252 and not r.paired
    assert r.pvalue == pytest.approx(2 / 252, abs=1e-12)
    rng = np.random.default_rng(11)
    a, c = rng.normal(size=4), rng.normal(size=6)
    r = permutation_test(np.append(a, np.nan), c)
    assert (r.n_a, r.n_b, r.nan) == (4, 6, 1) and r.permutations == 210
    assert r.pvalue == pytest.approx(brute_unpaired_p(a, c), abs=1e-12)
    pooled = math.sqrt((3 * a.var(ddof=1) + 5 * c.var(ddof=1)) / 8)
    assert r.effect_size == pytest.approx((a.mean() - c.mean()) / pooled)


def test_monte_carlo_when_too_many_flips() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=12), rng.normal(size=12)
    r = paired_permutation_test(a, b, resamples=999, seed=3)
    assert not r.exact and r.permutations == 999 and "Monte Carlo" in r.note
    assert r.pvalue == paired_permutation_test(a, b, resamples=999, seed=3).pvalue
    assert abs(r.pvalue - brute_paired_p(a, b)) < 0.05  # 4096 flips enumerated vs 999 drawn
