"""The copy task (SPEC §3): its inputs and targets, hand checked."""

from __future__ import annotations

import torch

from gradscope.config import TaskConfig
from gradscope.tasks import IGNORE
from gradscope.tasks.copy import Copy

I = IGNORE


def test_copy_targets_hand_checked() -> None:
    t = Copy(TaskConfig(name="copy", vocab_size=4, length=2, hold_min=1, hold_max=3))
    b = t.format(torch.tensor([[3, 1], [0, 2]]), torch.tensor([1, 3]))
    blank, delim, q = 4, 5, 6
    # T = 2L + hold_max + 1 = 8
    assert b.inputs.tolist() == [[3, 1, blank, delim, q, q, q, q], [0, 2, blank, blank, blank, delim, q, q]]
    assert b.targets.tolist() == [[I, I, I, I, 3, 1, I, I], [I, I, I, I, I, I, 0, 2]]
    assert t.num_classes == 6
