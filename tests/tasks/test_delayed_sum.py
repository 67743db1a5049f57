"""The delayed-sum task (SPEC §3): its inputs and targets, hand checked."""

from __future__ import annotations

import torch

from gradscope.config import TaskConfig
from gradscope.tasks import IGNORE
from gradscope.tasks.delayed_sum import DelayedSum

I = IGNORE


def test_delayed_sum_targets_hand_checked() -> None:
    t = DelayedSum(TaskConfig(name="delayed-sum", vocab_size=5, length=3))
    b = t.format(torch.tensor([[1, 2, 4]]), torch.tensor([[3, 3, 0]]))
    # target_t = (x_{L+1−t} + y_t) mod 5: (4+3)%5=2, (2+3)%5=0, (1+0)%5=1
    assert b.inputs.tolist() == [[1, 2, 4, 3, 3, 0]]
    assert b.targets.tolist() == [[I, I, I, 2, 0, 1]]
