"""Damerau–Levenshtein distance between predicted and target sequences (SPEC §5).

The reference is independent: a brute-force unrestricted DL (Lowrance–Wagner).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rapidfuzz.distance import OSA, Levenshtein

from gradscope.analysis.distance import dl_distances, scored_sequences, sequence_dl_distances
from gradscope.errors import GradscopeError
from gradscope.tasks.base import IGNORE

X = IGNORE

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
