"""The predecessor task (SPEC §3): its inputs and targets, hand checked, and its draws never repeat a token."""

from __future__ import annotations

import torch

from gradscope.config import TaskConfig
from gradscope.tasks import IGNORE
from gradscope.tasks.predecessor import Predecessor

from tests.tasks.test_base import gen

I = IGNORE


def test_predecessor_targets_hand_checked_and_non_repeating() -> None:
    t = Predecessor(TaskConfig(name="predecessor", vocab_size=9, length=4))
    b = t.format(torch.tensor([[7, 1, 5, 2]]), torch.tensor([3]))  # x_3 = 5 → predecessor x_2 = 1
    assert b.inputs.tolist() == [[7, 1, 5, 2, 5]]
    assert b.targets.tolist() == [[I, I, I, I, 1]]
    for dist in ("uniform", "dual"):
        s = Predecessor(TaskConfig(name="predecessor", vocab_size=9, length=6, distribution=dist)).sample(500, gen(3))
        x = s.inputs[:, :6]
        assert all(len(set(row)) == 6 for row in x.tolist())
        answer = s.targets[:, -1]
        q = (x == s.inputs[:, 6:7]).float().argmax(1)  # 0-based position of the cue
        assert bool((q >= 1).all()) and torch.equal(answer, x[torch.arange(500), q - 1])
