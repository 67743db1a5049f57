"""``delayed-sum``: output-phase inputs are fresh tokens y_t; target_t = (x_{L+1−t} + y_t) mod K."""

from __future__ import annotations

from typing import ClassVar

import torch

from gradscope.tasks.base import IGNORE, Batch, Task


class DelayedSum(Task):
    name: ClassVar[str] = "delayed-sum"

    def n_patterns(self) -> int:
        return self.cfg.vocab_size ** (2 * self.cfg.length)

    def format(self, x: torch.Tensor, y: torch.Tensor) -> Batch:
        """x, y (n, L) → inputs [x, y], targets [IGNORE…, (x reversed + y) mod K]."""
        n, length = x.shape
        inputs = torch.cat([x, y], dim=1)
        targets = torch.cat([self.full(n, length, IGNORE, x), (x.flip(1) + y) % self.cfg.vocab_size], dim=1)
        return Batch(inputs, targets)

    def sample(self, n: int, gen: torch.Generator) -> Batch:
        x = self.tokens((n, self.cfg.length), gen)
        return self.format(x, self.tokens((n, self.cfg.length), gen))
