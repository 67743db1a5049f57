"""Accuracy of point predictions (the continuous task, paper App. B.3): the cosine similarity of
prediction and target per position, and bootstrap intervals of its mean per position (pure
functions; scipy's bootstrap, always seeded)."""

from __future__ import annotations

import numpy as np
import torch

from gradscope.errors import check
from gradscope.fields import CONFIDENCE, RESAMPLES


def cosine_similarity(preds: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """cos(p, t) = ⟨p, t⟩ / (‖p‖ ‖t‖) per position: preds, targets (n, T, d) → (n, T) float64, NaN
    where the target is unscored (NaN) or the prediction is the zero vector (no direction)."""
    check(preds.shape == targets.shape and preds.dim() == 3,
          f"preds: got shape {tuple(preds.shape)}; expected the targets' shape (n, T, d) = {tuple(targets.shape)}")
    p, t = preds.double(), targets.double()
    dot = (p * t).sum(-1)
    norms = p.norm(dim=-1) * t.norm(dim=-1)
    return torch.where(norms > 0, dot / norms, torch.full_like(dot, float("nan")))


def position_mean_ci(values: np.ndarray, *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over rows of ``values`` (n, P) per column and its percentile-bootstrap interval,
    resampling rows (sequences) with scipy, ``seed``-ed: (mean, low, high), each (P,). Columns with
    fewer than 2 values, or all equal, get NaN bounds."""
    from scipy import stats

    values = np.asarray(values, dtype=np.float64)
    check(values.ndim == 2, f"values: got {values.ndim} dimension(s); expected (n, P)")
    mean = values.mean(axis=0) if values.shape[0] else np.full(values.shape[1], np.nan)
    low = np.full(values.shape[1], np.nan)
    high = np.full(values.shape[1], np.nan)
    ok = (values.shape[0] >= 2) & np.isfinite(values).all(axis=0) & (np.ptp(values, axis=0) > 0) \
        if values.shape[0] else np.zeros(values.shape[1], dtype=bool)
    if ok.any():
        res = stats.bootstrap((values[:, ok],), np.mean, axis=0, vectorized=True, n_resamples=resamples,
                              confidence_level=confidence, method="percentile", batch=500,
                              rng=np.random.default_rng(seed))
        low[ok], high[ok] = res.confidence_interval.low, res.confidence_interval.high
    return mean, low, high
