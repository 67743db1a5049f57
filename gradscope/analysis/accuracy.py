"""Accuracy of predictions against targets (pure tensor functions; SPEC §5).

Positions whose target is IGNORE (-100) are not scored.
"""

from __future__ import annotations

import torch

from gradscope.tasks.base import IGNORE


def token_correct(preds: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, scored): bool tensors of the targets' shape."""
    scored = targets != IGNORE
    return (preds == targets) & scored, scored


def token_accuracy(preds: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Fraction of scored positions predicted right (scalar; NaN if nothing is scored)."""
    correct, scored = token_correct(preds, targets)
    return correct.sum() / scored.sum()


def position_accuracy(preds: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Accuracy per time index over the batch: (B, T) → (T,), NaN where no row is scored."""
    correct, scored = token_correct(preds, targets)
    return correct.sum(0) / scored.sum(0)


def sequence_accuracy(preds: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Fraction of rows whose every scored position is right (full match)."""
    correct, scored = token_correct(preds, targets)
    return (correct == scored).all(dim=1).float().mean()


def grid_target_accuracy(preds: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Accuracy of the target token only, on the dual-frequency grid of the reverse task.

    preds (2, 2, N, L, 2L) predicted tokens for grid sequences (2 tg, 2 dg, N, L position, L);
    the target at input position p (0-based) is recalled at output index 2L − 1 − p.
    Returns (2 target group, 2 disturbant group, L position) accuracies.
    """
    length = grid.shape[-1]
    p = torch.arange(length, device=grid.device)
    recalled = preds[..., p, 2 * length - 1 - p]  # (2, 2, N, L)
    truth = grid[..., p, p]  # (2, 2, N, L)
    return (recalled == truth).float().mean(dim=2)
