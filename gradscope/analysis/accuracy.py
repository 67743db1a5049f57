"""Accuracy of predictions against targets (pure tensor functions; docs/definitions.md §5).

Positions whose target is IGNORE (-100) are not scored. Each metric comes in two steps, as in
torchmetrics: an *update* step that returns integer counts (``*_counts``: correct, total), which
can be summed over chunks of a large evaluation, and a *compute* step, ``ratio(correct, total)``.
"""

from __future__ import annotations

import torch

from gradscope.errors import check
from gradscope.fields import DEFAULT_BINS  # noqa: F401 - declared with the options
from gradscope.tasks.base import IGNORE
from gradscope.tasks.reverse_variable import LENGTH_KINDS, length_counts  # reverse-variable's counts live with its family



def token_correct(preds: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, scored): bool tensors of the targets' shape."""
    scored = targets != IGNORE
    return (preds == targets) & scored, scored


def ratio(correct: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """Compute step: correct / total as floats, NaN where total is 0 (nothing scored)."""
    return correct.double().div(total.double()).float()


def token_accuracy(preds: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Fraction of scored positions predicted right (scalar; NaN if nothing is scored)."""
    correct, scored = token_correct(preds, targets)
    return correct.sum() / scored.sum()


def position_counts(preds: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Update step of `position_accuracy`: (B, T) → (correct (T,), scored (T,)) int64 counts."""
    correct, scored = token_correct(preds, targets)
    return correct.sum(0), scored.sum(0)


def position_accuracy(preds: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Accuracy per time index over the batch: (B, T) → (T,), NaN where no row is scored."""
    return ratio(*position_counts(preds, targets))


def sequence_accuracy(preds: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Fraction of rows whose every scored position is right (full match), over the rows with a
    scored position; NaN if no row has one (nothing was scored: not a perfect score)."""
    correct, scored = token_correct(preds, targets)
    has = scored.any(dim=1)
    return (correct == scored).all(dim=1)[has].float().mean()


# --- reverse-variable: accuracy per sequence length ---------------------------------------------

def accuracy_by_length(preds: torch.Tensor, targets: torch.Tensor, lengths: torch.Tensor | None = None,
                       kind: str = LENGTH_KINDS[0]) -> dict[int, float]:
    """Accuracy per sequence length {ℓ: accuracy} over the lengths that occur (see `length_counts`)."""
    correct, total = length_counts(preds, targets, lengths, kind)
    present = torch.nonzero(total).flatten().tolist()
    acc = ratio(correct, total)
    return {ell: float(acc[ell]) for ell in present}


# --- the dual-frequency grid of the reverse task ------------------------------------------------

def _check_grid(preds: torch.Tensor, grid: torch.Tensor) -> None:
    check(grid.ndim == 5 and grid.shape[:2] == (2, 2) and grid.shape[3] == grid.shape[4],
          f"grid: got shape {tuple(grid.shape)}; expected (2, 2, N, L, L)")
    n, length = grid.shape[2], grid.shape[-1]
    check(preds.shape == (2, 2, n, length, 2 * length),
          f"preds: got shape {tuple(preds.shape)}; expected (2, 2, N, L, 2L) = {(2, 2, n, length, 2 * length)} "
          "(flat predictions of grid_batch are in (tg, dg, N, p) order: reshape them)")


def grid_counts(preds: torch.Tensor, grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Update step of `grid_target_accuracy`; chunks along N can be summed.

    preds (2, 2, N, L, 2L) predicted tokens for grid sequences (2, 2, N, L, L); the target at
    input position p (0-based) is recalled at output index 2L − 1 − p. Returns (correct, total),
    each (2 target group, 2 disturbant group, L position) int64; total is N everywhere.
    """
    _check_grid(preds, grid)
    length = grid.shape[-1]
    p = torch.arange(length, device=grid.device)
    recalled = preds[..., p, 2 * length - 1 - p]  # (2, 2, N, L)
    truth = grid[..., p, p]  # (2, 2, N, L)
    correct = (recalled == truth).sum(dim=2)  # (2, 2, L)
    return correct, torch.full_like(correct, grid.shape[2])


def grid_item_counts(preds: torch.Tensor, grid: torch.Tensor, old_items: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`grid_counts` split by the target item of an extended vocabulary: old (< old_items) or new.
    Returns (correct, total), each (2 target group, 2 disturbant group, 2 item [old, new], L) int64."""
    _check_grid(preds, grid)
    length = grid.shape[-1]
    p = torch.arange(length, device=grid.device)
    truth = grid[..., p, p]  # (2, 2, N, L)
    right = preds[..., p, 2 * length - 1 - p] == truth
    new = truth >= old_items
    correct = torch.stack([(right & ~new).sum(2), (right & new).sum(2)], dim=2)
    total = torch.stack([(~new).sum(2), new.sum(2)], dim=2)
    return correct, total


def grid_target_accuracy(preds: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Accuracy of the target token only, on the dual-frequency grid of the reverse task.

    preds (2, 2, N, L, 2L) predicted tokens for grid sequences (2 tg, 2 dg, N, L position, L);
    the target at input position p (0-based) is recalled at output index 2L − 1 − p.
    Returns (2 target group, 2 disturbant group, L position) accuracies.
    """
    return ratio(*grid_counts(preds, grid))


def position_bins(length: int, bins: int | list[int] = DEFAULT_BINS) -> list[tuple[int, int]]:
    """Bins of target positions as 1-based inclusive (first, last) ranges.

    An int splits 1…length into that many contiguous bins as equal as possible (earlier bins take
    the remainder): length 64, bins 4 → (1, 16), (17, 32), (33, 48), (49, 64). A list gives explicit
    edges e_0 < e_1 < … < e_k in 0 … length, histogram style: bin i holds positions e_i + 1 … e_{i+1},
    so [0, 16, 32, 48, 64] gives the quarters above and [0, 8, 64] gives (1, 8), (9, 64).
    """
    check(isinstance(length, int) and length >= 1, f"length: got {length!r}; expected a positive int")
    if isinstance(bins, int):
        check(1 <= bins <= length, f"bins: got {bins}; expected an int in 1…{length} (the length) or a list of edges")
        size, extra = divmod(length, bins)
        edges = [0]
        for i in range(bins):
            edges.append(edges[-1] + size + (i < extra))
    else:
        edges = [int(e) for e in bins]
        check(len(edges) >= 2 and edges[0] >= 0 and edges[-1] <= length
              and all(a < b for a, b in zip(edges, edges[1:])),
              f"bins: got edges {edges}; expected at least two strictly increasing edges within 0…{length}")
    return [(lo + 1, hi) for lo, hi in zip(edges, edges[1:])]


def bin_sum(x: torch.Tensor, bins: int | list[int] = DEFAULT_BINS) -> torch.Tensor:
    """Sum over target positions in each bin: (..., L) → (..., n_bins) (use on counts)."""
    return torch.stack([x[..., lo - 1:hi].sum(-1) for lo, hi in position_bins(x.shape[-1], bins)], dim=-1)


def binned_counts(correct: torch.Tensor, total: torch.Tensor,
                  bins: int | list[int] = DEFAULT_BINS) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts (..., L) → counts per position bin (..., n_bins); `ratio` of them is the pooled accuracy."""
    return bin_sum(correct, bins), bin_sum(total, bins)


def binned_grid_accuracy(acc: torch.Tensor, bins: int | list[int] = DEFAULT_BINS) -> torch.Tensor:
    """Mean accuracy over the target positions of each bin: (2, 2, L) → (2, 2, n_bins).

    Every grid position has the same number N of sequences, so this equals the pooled accuracy of
    the bin; with unequal counts use `binned_counts`. NaN positions make their bin NaN.
    """
    ranges = position_bins(acc.shape[-1], bins)
    return torch.stack([acc[..., lo - 1:hi].mean(-1) for lo, hi in ranges], dim=-1)


def bin_edges(length: int, bins: int | tuple[int, ...]) -> list[tuple[int, int]]:
    """1-based inclusive (start, end) of each target-position bin."""
    return position_bins(length, bins_arg(bins))


def bins_arg(bins: int | tuple[int, ...]) -> int | list[int]:
    """The bins option as the analysis functions take it (a count, or a list of edges)."""
    return list(bins) if isinstance(bins, tuple) else bins
