"""``copy`` (copying-memory): L tokens from a data vocabulary V, a hold phase of h blanks
(h ~ U[hold_min, hold_max] per sequence), a delimiter, then reproduce the L tokens.

Token ids: data 0…V−1, blank V, delimiter V+1; so K = V + 2 classes and the query token is V + 2.
Rows are right-padded with the query token to T = 2L + hold_max + 1 (unscored).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from gradscope.errors import check
from gradscope.tasks.base import IGNORE, Batch, Task
from gradscope.tasks.fields import TaskFields


class Copy(Task):
    name: ClassVar[str] = "copy"
    settings: ClassVar[tuple[str, ...]] = ("distribution", "rarity", "hold_min", "hold_max")
    tiny = {"hold_min": 2, "hold_max": 3}

    @classmethod
    def check_config(cls, cfg: TaskFields) -> None:
        check(0 <= cfg.hold_min <= cfg.hold_max,
              f"hold_min/hold_max: got {cfg.hold_min}/{cfg.hold_max}; need 0 <= min <= max")

    @property
    def num_classes(self) -> int:
        return self.cfg.vocab_size + 2

    @property
    def blank(self) -> int:
        return self.cfg.vocab_size

    @property
    def delimiter(self) -> int:
        return self.cfg.vocab_size + 1

    @property
    def total_len(self) -> int:
        return 2 * self.cfg.length + self.cfg.hold_max + 1

    def n_patterns(self) -> int:
        return self.cfg.vocab_size ** self.cfg.length * (self.cfg.hold_max - self.cfg.hold_min + 1)

    def format(self, x: torch.Tensor, hold: torch.Tensor) -> Batch:
        """x (n, L) data tokens, hold (n,) blank counts → (n, T) inputs/targets."""
        n, length = x.shape
        t = torch.arange(self.total_len, device=x.device)[None, :]  # (1, T)
        h = hold[:, None]
        delim_at = length + h  # (n, 1)
        recalled = torch.gather(x, 1, (t - delim_at - 1).clamp(0, length - 1))
        data = torch.gather(x, 1, t.clamp(max=length - 1).expand(n, -1))
        inputs = torch.where(t < length, data, self.blank)
        inputs = torch.where(t == delim_at, self.delimiter, inputs)
        inputs = torch.where(t > delim_at, self.query, inputs)
        scored = (t > delim_at) & (t <= delim_at + length)
        return Batch(inputs, torch.where(scored, recalled, IGNORE))

    def sample(self, n: int, gen: torch.Generator) -> Batch:
        cfg = self.cfg
        hold = torch.randint(cfg.hold_min, cfg.hold_max + 1, (n,), generator=gen, device=gen.device)
        return self.format(self.tokens((n, cfg.length), gen), hold)
