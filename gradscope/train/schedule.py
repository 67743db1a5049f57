"""Learning-rate schedule (docs/definitions.md §3): linear warm-up from 0, then cosine annealing to 0.

The schedule is a pure function of the iteration, so resuming needs only the iteration count.
"""

from __future__ import annotations

import math


def lr_at(iteration: int, base_lr: float, warmup: int, total: int) -> float:
    """Learning rate for 0-based ``iteration`` of ``total``: base·(i+1)/warmup during warm-up,
    then base·½(1 + cos(π·progress)) with progress going from 0 to 1 over the remaining steps."""
    if iteration < warmup:
        return base_lr * (iteration + 1) / warmup
    span = max(total - warmup, 1)
    progress = min((iteration - warmup) / span, 1.0)
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * progress))
