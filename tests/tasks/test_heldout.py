"""Held-out sets (``tasks.heldout``): a set the task's distribution cannot fill, or one that leaves no
training data, is a user error naming heldout_size."""

from __future__ import annotations

import pytest
import torch

from gradscope.config import TaskConfig
from gradscope.errors import GradscopeError


def test_held_out_sets_that_cannot_be_drawn_are_a_user_error() -> None:
    """A held-out set that the task's distribution cannot fill (or that leaves no training data)
    is a one-line error naming heldout_size, not a RuntimeError."""
    from gradscope.tasks import Batch, Excluder, make_task, sample_excluding, sample_unique
    same_row = lambda k: Batch(torch.zeros(k, 4, dtype=torch.long), torch.zeros(k, 4, dtype=torch.long))  # noqa: E731
    with pytest.raises(GradscopeError, match="heldout_size"):
        sample_unique(same_row, 2)
    task = make_task(TaskConfig(vocab_size=2, length=1, heldout_size=1))
    every_row = torch.tensor([[0, 2], [1, 2]])
    with pytest.raises(GradscopeError, match="heldout_size"):
        sample_excluding(task, 4, torch.Generator().manual_seed(0), Excluder(every_row))
