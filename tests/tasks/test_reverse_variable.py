"""The reverse-variable task (SPEC §3): its inputs and targets, hand checked."""

from __future__ import annotations

import torch

from gradscope.config import TaskConfig
from gradscope.tasks import IGNORE
from gradscope.tasks.reverse_variable import ReverseVariable

I = IGNORE


def test_reverse_variable_targets_hand_checked() -> None:
    t = ReverseVariable(TaskConfig(name="reverse-variable", vocab_size=5, length=4, min_length=2))
    b = t.format(torch.tensor([[1, 2, 3, 4], [4, 3, 2, 1]]), torch.tensor([2, 4]))
    assert b.inputs.tolist() == [[1, 2, 5, 5, 5, 5, 5, 5], [4, 3, 2, 1, 5, 5, 5, 5]]
    assert b.targets.tolist() == [[I, I, 2, 1, I, I, I, I], [I, I, I, I, 1, 2, 3, 4]]
    assert t.lengths_of(b).tolist() == [2, 4]
