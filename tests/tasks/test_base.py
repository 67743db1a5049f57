"""What every token task does (SPEC §3): sampling is seeded and well formed. Each task's own format is
hand checked in tests/tasks/test_<task>.py."""

from __future__ import annotations

import pytest
import torch

from gradscope.config import TaskConfig
from gradscope.tasks import IGNORE, make_task


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name", ["reverse", "reverse-variable", "sort", "delayed-sum", "predecessor", "copy"])
def test_sampling_is_seeded_and_well_formed(name: str) -> None:
    cfg = TaskConfig(name=name, vocab_size=10, length=6, min_length=3, hold_min=2, hold_max=5, distribution="dual")
    task = make_task(cfg)
    a, b = task.sample(64, gen(9)), task.sample(64, gen(9))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert a.inputs.shape == (64, task.total_len)
    assert int(a.inputs.max()) <= task.query and int(a.inputs.min()) >= 0
    scored = a.targets[a.targets != IGNORE]
    assert scored.numel() > 0 and int(scored.max()) < task.num_classes
