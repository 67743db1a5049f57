"""Damerau–Levenshtein distance between predicted and target sequences (docs/definitions.md §5).

The paper's sequence-level error. rapidfuzz's `DamerauLevenshtein` is the *unrestricted* variant
(a substring may be edited after a transposition: "ca" → "abc" is 2, where the restricted optimal
string alignment distance is 3); it accepts sequences of ints. Pairs are scored aligned, row i
against row i, with `rapidfuzz.process.cpdist` (C++, no Python loop); never all pairs (cdist).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from rapidfuzz.distance import DamerauLevenshtein
from rapidfuzz.process import cpdist

from gradscope.errors import check
from gradscope.tasks.base import IGNORE

Rows = Sequence[Sequence[int]] | np.ndarray


def scored_sequences(preds: torch.Tensor, targets: torch.Tensor) -> tuple[list[list[int]], list[list[int]]]:
    """Per row, the predicted and target tokens at the scored positions (targets != IGNORE).

    preds, targets (n, T) → (pred_rows, target_rows), two lists of n int lists; row i has as many
    entries as row i has scored positions (rows may differ, e.g. in reverse-variable).
    """
    check(preds.shape == targets.shape and targets.ndim == 2,
          f"preds: got shape {tuple(preds.shape)}; expected targets' shape (n, T) = {tuple(targets.shape)}")
    mask = targets != IGNORE  # (n, T)
    counts = mask.sum(1).tolist()  # (n,)
    preds_flat, targets_flat = preds[mask].tolist(), targets[mask].tolist()  # row-major: row by row
    ends = np.cumsum(counts).tolist()
    starts = [0, *ends[:-1]]
    return ([preds_flat[a:b] for a, b in zip(starts, ends)],
            [targets_flat[a:b] for a, b in zip(starts, ends)])


def dl_distances(pred_rows: Rows, target_rows: Rows, *, normalized: bool = False, workers: int = 1) -> np.ndarray:
    """Damerau–Levenshtein distance of each aligned pair (pred_rows[i], target_rows[i]).

    pred_rows, target_rows: n int sequences each (lists of lists, ragged allowed, or (n, ·) arrays).
    Returns (n,) int64 edit counts, or float64 distances divided by the longer length in [0, 1]
    with ``normalized`` (0 for two empty rows). ``workers`` threads (-1: all cores).
    """
    n_pred, n_target = len(pred_rows), len(target_rows)
    check(n_pred == n_target, f"target_rows: got {n_target} rows; expected as many as pred_rows ({n_pred})")
    if n_pred == 0:
        return np.zeros(0, dtype=np.float64 if normalized else np.int64)
    if isinstance(pred_rows, torch.Tensor):
        pred_rows = pred_rows.tolist()
    if isinstance(target_rows, torch.Tensor):
        target_rows = target_rows.tolist()
    scorer = DamerauLevenshtein.normalized_distance if normalized else DamerauLevenshtein.distance
    out = cpdist(pred_rows, target_rows, scorer=scorer, workers=workers,
                 dtype=np.float64 if normalized else np.int64)
    return np.asarray(out)


def sequence_dl_distances(preds: torch.Tensor, targets: torch.Tensor, *, normalized: bool = False,
                          workers: int = 1) -> np.ndarray:
    """DL distance between each row's predicted and target sequence: (n, T), (n, T) → (n,).

    Only scored positions (targets != IGNORE) form the sequences; see `scored_sequences`.
    """
    pred_rows, target_rows = scored_sequences(preds, targets)
    return dl_distances(pred_rows, target_rows, normalized=normalized, workers=workers)
