"""``reverse-variable``: like reverse, with L ~ U[min_length, length] per sequence.

Rows are right-padded with the query token to T = 2·length; padding is never scored, and because
every core is causal, padding after a sequence cannot change its outputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from gradscope.errors import check
from gradscope.tasks.base import IGNORE, Batch, Task

if TYPE_CHECKING:
    from gradscope.tasks.config import TaskConfig


class ReverseVariable(Task):
    name: ClassVar[str] = "reverse-variable"
    settings: ClassVar[tuple[str, ...]] = ("distribution", "rarity", "min_length")
    probes: ClassVar[bool] = True

    @classmethod
    def check_config(cls, cfg: "TaskConfig") -> None:
        check(1 <= cfg.min_length <= cfg.length,
              f"min_length: got {cfg.min_length}; need 1 <= min_length <= length ({cfg.length})")

    def n_patterns(self) -> int:
        return sum(self.cfg.vocab_size ** n for n in range(self.cfg.min_length, self.cfg.length + 1))

    def format(self, x: torch.Tensor, lengths: torch.Tensor) -> Batch:
        """x (n, Lmax) with only the first lengths[i] entries used → (n, 2·Lmax) inputs/targets."""
        n, lmax = x.shape
        t = torch.arange(2 * lmax, device=x.device)[None, :]  # (1, T)
        ell = lengths[:, None]  # (n, 1)
        padded = torch.cat([x, self.full(n, lmax, self.query, x)], dim=1)  # (n, T)
        inputs = torch.where(t < ell, padded, self.query)
        source = (2 * ell - 1 - t).clamp(0, lmax - 1)  # input index recalled at output time t
        recalled = torch.gather(x, 1, source)
        targets = torch.where((t >= ell) & (t < 2 * ell), recalled, IGNORE)
        return Batch(inputs, targets)

    def sample(self, n: int, gen: torch.Generator) -> Batch:
        lengths = torch.randint(self.cfg.min_length, self.cfg.length + 1, (n,), generator=gen, device=gen.device)
        return self.format(self.tokens((n, self.cfg.length), gen), lengths)

    @staticmethod
    def lengths_of(batch: Batch) -> torch.Tensor:
        """Per-row sequence length L, recovered from the number of scored positions."""
        return (batch.targets != IGNORE).sum(dim=1)
