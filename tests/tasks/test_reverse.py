"""The reverse task (SPEC §3): its inputs and targets, hand checked."""

from __future__ import annotations

import torch

from gradscope.config import TaskConfig
from gradscope.tasks import IGNORE
from gradscope.tasks.reverse import Reverse

I = IGNORE


def test_reverse_targets_hand_checked() -> None:
    t = Reverse(TaskConfig(vocab_size=5, length=3))
    b = t.format(torch.tensor([[1, 2, 3]]))
    assert b.inputs.tolist() == [[1, 2, 3, 5, 5, 5]]
    assert b.targets.tolist() == [[I, I, I, 3, 2, 1]]
