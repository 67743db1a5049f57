"""Probe triplets for gradient stability (SPEC §4).

Around a target position p (1-based) in sequences of length L:
    base        = (P,  x,  S)
    same-target = (P,  x,  S′)   shares everything up to and including the target
    same-suffix = (P′, x′, S)    shares the suffix; target (x′ ≠ x where the group allows) and prefix differ
Disturbants (prefix and suffix) come from one frequency group, the target from one group. The
model reads the L tokens, then L query tokens (the output phase; PE continues through it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gradscope.errors import check
from gradscope.tasks.vocab import group_bounds

MEMBERS = ("base", "same-target", "same-suffix")
GROUPS = ("frequent", "rare", "all")


@dataclass(frozen=True)
class Probes:
    """tokens (n, 3 member, L); target_group / disturbant_group: one label per triplet."""

    tokens: torch.Tensor
    target_group: tuple[str, ...]
    disturbant_group: tuple[str, ...]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def length(self) -> int:
        return self.tokens.shape[-1]

    @property
    def conditions(self) -> tuple[str, ...]:
        """'target/disturbant' label per triplet."""
        return tuple(f"{t}/{d}" for t, d in zip(self.target_group, self.disturbant_group))

    def model_inputs(self, query: int) -> torch.Tensor:
        """(n·3, 2L) rows: the probe tokens, then L query tokens; order (triplet, member)."""
        x = self.tokens.reshape(-1, self.length)
        return torch.cat([x, torch.full_like(x, query)], dim=1)


def _bounds(group: str, vocab_size: int) -> tuple[int, int]:
    if group == "all":
        return 0, vocab_size
    return group_bounds(vocab_size, GROUPS.index(group))


def _draw(shape: tuple[int, ...], group: str, vocab_size: int, gen: torch.Generator) -> torch.Tensor:
    low, high = _bounds(group, vocab_size)
    return torch.randint(low, high, shape, generator=gen)


def make_triplets(n: int, length: int, position: int, vocab_size: int, target_group: str, disturbant_group: str,
                  gen: torch.Generator) -> torch.Tensor:
    """n triplets (n, 3, L) for one condition, drawn from ``gen`` (CPU)."""
    check(1 <= position <= length, f"target position: got {position}; valid positions are 1…{length}")
    for name, g in (("target group", target_group), ("disturbant group", disturbant_group)):
        check(g in GROUPS, f"{name}: got {g!r}; valid values are {', '.join(GROUPS)}")
    p = position - 1
    base = _draw((n, length), disturbant_group, vocab_size, gen)
    base[:, p] = _draw((n,), target_group, vocab_size, gen)
    same_target = base.clone()
    same_target[:, p + 1:] = _draw((n, length - p - 1), disturbant_group, vocab_size, gen)
    same_suffix = base.clone()
    same_suffix[:, :p] = _draw((n, p), disturbant_group, vocab_size, gen)
    low, high = _bounds(target_group, vocab_size)
    if high - low > 1:  # a different target from the same group
        shift = torch.randint(1, high - low, (n,), generator=gen)
        same_suffix[:, p] = low + (base[:, p] - low + shift) % (high - low)
    return torch.stack([base, same_target, same_suffix], dim=1)


def make_probes(n: int, length: int, position: int, vocab_size: int, conditions: list[tuple[str, str]],
                seed: int) -> Probes:
    """``n`` triplets for each (target group, disturbant group) condition (balanced), seeded."""
    check(n >= 1, f"triplets: got {n}; need at least 1 per condition")
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.cat([make_triplets(n, length, position, vocab_size, t, d, gen) for t, d in conditions])
    return Probes(tokens, tuple(t for t, _ in conditions for _ in range(n)),
                  tuple(d for _, d in conditions for _ in range(n)))


def check_probes_fit(probes: Probes, vocab_size: int, length: int) -> None:
    """Probe tokens must be vocabulary tokens (not the query) and have the model's input length."""
    check(probes.tokens.dim() == 3 and probes.tokens.shape[1] == 3,
          f"probes: got shape {tuple(probes.tokens.shape)}; expected (n, 3, L)")
    check(probes.length == length,
          f"probes: sequences have length {probes.length}; this checkpoint's task has L = {length}")
    low, high = int(probes.tokens.min()), int(probes.tokens.max())
    check(low >= 0 and high < vocab_size,
          f"probes: token ids span {low}…{high}; this model's vocabulary is 0…{vocab_size - 1}")
