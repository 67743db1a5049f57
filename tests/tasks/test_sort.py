"""The sort task (SPEC §3): its inputs and targets, hand checked."""

from __future__ import annotations

import torch

from gradscope.config import TaskConfig
from gradscope.tasks import IGNORE
from gradscope.tasks.sort import Sort

I = IGNORE


def test_sort_targets_hand_checked() -> None:
    b = Sort(TaskConfig(name="sort", vocab_size=5, length=4)).format(torch.tensor([[3, 0, 3, 1]]))
    assert b.targets.tolist() == [[I, I, I, I, 0, 1, 3, 3]]
