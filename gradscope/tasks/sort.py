"""``sort``: x_1…x_L ↦ the same tokens in ascending order (ties kept)."""

from __future__ import annotations

import torch

from gradscope.tasks.base import IGNORE, Batch, Task


class Sort(Task):
    def n_patterns(self) -> int:
        return self.cfg.vocab_size ** self.cfg.length

    def format(self, x: torch.Tensor) -> Batch:
        n, length = x.shape
        inputs = torch.cat([x, self.full(n, length, self.query, x)], dim=1)
        targets = torch.cat([self.full(n, length, IGNORE, x), x.sort(dim=1).values], dim=1)
        return Batch(inputs, targets)

    def sample(self, n: int, gen: torch.Generator) -> Batch:
        return self.format(self.tokens((n, self.cfg.length), gen))
