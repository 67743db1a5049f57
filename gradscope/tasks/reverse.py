"""``reverse`` (docs/definitions.md §3): x_1…x_L ↦ x_L…x_1; output-phase inputs are the query token."""

from __future__ import annotations

from typing import ClassVar

import torch

from gradscope.tasks.base import IGNORE, Batch, Task


class Reverse(Task):
    name: ClassVar[str] = "reverse"
    settings: ClassVar[tuple[str, ...]] = ("distribution", "rarity", "grid_per_cell")  # the grid: dual reverse only
    probes: ClassVar[bool] = True
    tiny = {"distribution": "dual", "grid_per_cell": 2}

    def n_patterns(self) -> int:
        return self.cfg.vocab_size ** self.cfg.length

    def format(self, x: torch.Tensor) -> Batch:
        """Raw sequences x (n, L) → model inputs/targets (n, 2L)."""
        n, length = x.shape
        inputs = torch.cat([x, self.full(n, length, self.query, x)], dim=1)
        targets = torch.cat([self.full(n, length, IGNORE, x), self.recall(x)], dim=1)
        return Batch(inputs, targets)

    def recall(self, x: torch.Tensor) -> torch.Tensor:
        """The output phase's targets for raw sequences x (n, L): x_L … x_1."""
        return x.flip(1)

    def sample(self, n: int, gen: torch.Generator) -> Batch:
        return self.format(self.tokens((n, self.cfg.length), gen))
