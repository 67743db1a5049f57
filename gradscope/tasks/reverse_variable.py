"""``reverse-variable``: like reverse, with L ~ U[min_length, length] per sequence.

Rows are right-padded with the query token to T = 2·length; padding is never scored, and because
every core is causal, padding after a sequence cannot change its outputs.
"""

from __future__ import annotations

from typing import ClassVar, Mapping, Sequence

import numpy as np
import torch

from gradscope.errors import check
from gradscope.tasks.base import IGNORE, Batch, Task
from gradscope.tasks.family import FLOAT, INT, Part, Variable, ratio, stack
from gradscope.tasks.fields import TaskFields


class ReverseVariable(Task):
    name: ClassVar[str] = "reverse-variable"
    settings: ClassVar[tuple[str, ...]] = ("distribution", "rarity", "min_length")
    probes: ClassVar[bool] = True
    tiny = {"min_length": 2}
    layout = {"length_accuracy": Variable(dims=("checkpoint", "length"), kind=FLOAT,
                                          help="token accuracy per sequence length"),
              "length": Variable(dims=("length",), kind=INT, help="the sequence lengths that occur")}

    @classmethod
    def check_config(cls, cfg: TaskFields) -> None:
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

    def score(self, batch: Batch, preds: torch.Tensor) -> dict[str, np.ndarray]:
        """Token counts per sequence length L (index L), over the held-out rows."""
        correct, total = length_counts(preds, batch.targets)
        return {"length_correct": correct.numpy(), "length_total": total.numpy()}

    @classmethod
    def accuracy_part(cls, counts: Sequence[Mapping[str, np.ndarray]]) -> tuple[Part, Part]:
        lengths = np.flatnonzero(counts[0]["length_total"] > 0)
        accuracy = ratio(stack(counts, "length_correct"), stack(counts, "length_total"))[:, lengths]
        return {"length_accuracy": (("checkpoint", "length"), accuracy)}, {"length": lengths}

    @classmethod
    def lines(cls, last: Mapping[str, np.ndarray]) -> list[str]:
        pairs = ", ".join(f"L={n}: {a:.3f}" for n, a in zip(last["length"], last["length_accuracy"]))
        return [f"token accuracy by sequence length: {pairs}"]


LENGTH_KINDS = ("token", "sequence")  # what accuracy by length counts: scored positions, or whole rows


def length_counts(preds: torch.Tensor, targets: torch.Tensor, lengths: torch.Tensor | None = None,
                  kind: str = LENGTH_KINDS[0]) -> tuple[torch.Tensor, torch.Tensor]:
    """Update step of accuracy by sequence length: counts indexed by sequence length.

    preds, targets (n, T); lengths (n,) int, by default each row's number of scored positions (the
    length L of a reverse-variable row). kind "token" counts scored positions, "sequence" counts
    rows (a row is correct if every scored position is). Returns (correct, total), each
    (max(lengths) + 1,) int64, where entry ℓ belongs to rows of length ℓ.
    """
    check(kind in LENGTH_KINDS, f"kind: got {kind!r}; valid values are 'token', 'sequence'")
    check(preds.shape == targets.shape and targets.ndim == 2,
          f"preds: got shape {tuple(preds.shape)}; expected targets' shape (n, T) = {tuple(targets.shape)}")
    scored = targets != IGNORE
    correct = (preds == targets) & scored  # (n, T)
    if lengths is None:
        lengths = scored.sum(1)
    lengths = torch.as_tensor(lengths, device=targets.device).long()
    check(lengths.shape == targets.shape[:1],
          f"lengths: got shape {tuple(lengths.shape)}; expected one length per row ({targets.shape[0]},)")
    if kind == "token":
        row_correct, row_total = correct.sum(1), scored.sum(1)  # (n,)
    else:
        row_correct, row_total = (correct == scored).all(1).long(), torch.ones_like(lengths)
    size = int(lengths.max()) + 1 if lengths.numel() else 0
    return (torch.bincount(lengths, weights=row_correct.double(), minlength=size).long(),
            torch.bincount(lengths, weights=row_total.double(), minlength=size).long())
