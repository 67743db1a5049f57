"""``predecessor``: non-repeating x_1…x_L, then x_q (2 ≤ q ≤ L); the single target is x_{q−1}."""

from __future__ import annotations

import math

from typing import ClassVar

import torch

from gradscope.errors import check
from gradscope.tasks.base import IGNORE, Batch, Task
from gradscope.tasks.fields import TaskFields
from gradscope.tasks.vocab import token_weights


class Predecessor(Task):
    name: ClassVar[str] = "predecessor"

    @classmethod
    def check_config(cls, cfg: TaskFields) -> None:
        check(cfg.length >= 2, f"length: got {cfg.length}; predecessor needs L >= 2")
        check(cfg.vocab_size >= cfg.length, f"vocab_size: got {cfg.vocab_size}; predecessor needs non-repeating "
                                            f"tokens, so vocab_size must be >= length ({cfg.length})")

    @property
    def total_len(self) -> int:
        return self.cfg.length + 1

    def n_patterns(self) -> int:
        return math.perm(self.cfg.vocab_size, self.cfg.length) * (self.cfg.length - 1)

    def format(self, x: torch.Tensor, q: torch.Tensor) -> Batch:
        """x (n, L) distinct tokens, q (n,) 1-based query positions in [2, L] → (n, L+1) rows."""
        n, length = x.shape
        cue = torch.gather(x, 1, (q - 1)[:, None])  # x_q
        answer = torch.gather(x, 1, (q - 2)[:, None])  # x_{q−1}
        inputs = torch.cat([x, cue], dim=1)
        targets = torch.cat([self.full(n, length, IGNORE, x), answer], dim=1)
        return Batch(inputs, targets)

    def sample(self, n: int, gen: torch.Generator) -> Batch:
        cfg = self.cfg
        weights = token_weights(cfg.vocab_size, cfg.distribution, cfg.rarity).to(gen.device)
        x = torch.multinomial(weights.expand(n, -1), cfg.length, replacement=False, generator=gen)
        q = torch.randint(2, cfg.length + 1, (n,), generator=gen, device=gen.device)
        return self.format(x, q)
