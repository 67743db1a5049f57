"""Probe triplets for gradient stability (SPEC §4).

Around a target position p (1-based) in sequences of length L:
    base        = (P,  x,  S)
    same-target = (P,  x,  S′)   shares everything up to and including the target
    same-suffix = (P′, x′, S)    shares the suffix; target (x′ ≠ x where the group allows) and prefix differ
Disturbants (prefix and suffix) come from one frequency group, the target from one group. The
model reads the L tokens, then L query tokens (the output phase; PE continues through it).
"""

from __future__ import annotations

import math
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


def vocabulary_groups(vocab_size: int) -> dict[str, torch.Tensor]:
    """Token ids of each group of a dual-frequency vocabulary (SPEC §3): frequent = [0, K/2),
    rare = [K/2, K), all = [0, K)."""
    pools = {"all": torch.arange(vocab_size)}
    for i, name in enumerate(GROUPS[:2]):
        low, high = group_bounds(vocab_size, i)
        pools[name] = torch.arange(low, high)
    return pools


def frequency_groups(counts: torch.Tensor, split: float = 0.5) -> dict[str, torch.Tensor]:
    """Frequent and rare token ids from counts per token id (a user's corpus statistics).

    Tokens with a nonzero count are ranked by count (descending; ties by id); the top ``split``
    fraction of them (rounded up, at least one) is frequent, the rest rare. With the paper's dual
    vocabulary (every frequent token 7× as likely as every rare one) and split 0.5 this gives back
    its halves. Tokens never seen belong to no group; ``all`` holds every seen token.
    """
    counts = torch.as_tensor(counts)
    check(counts.dim() == 1 and counts.numel() >= 2 and not counts.is_complex() and bool((counts >= 0).all()),
          f"counts: expected non-negative counts per token id, shape (K,) with K >= 2; got shape {tuple(counts.shape)}")
    check(0 < split < 1, f"split: got {split}; it must lie strictly between 0 and 1")
    seen = torch.nonzero(counts > 0).flatten()
    check(seen.numel() >= 2, f"counts: only {seen.numel()} token(s) have a nonzero count; need at least 2")
    order = seen[torch.argsort(-counts[seen].double(), stable=True)]
    n_freq = min(seen.numel() - 1, max(1, math.ceil(split * seen.numel())))
    return {"frequent": order[:n_freq].sort().values, "rare": order[n_freq:].sort().values, "all": seen}


def make_triplets(n: int, length: int, position: int, pools: dict[str, torch.Tensor], target_group: str,
                  disturbant_group: str, gen: torch.Generator) -> torch.Tensor:
    """n triplets (n, 3, L) for one condition, tokens drawn uniformly from the groups' id pools
    (``pools``: group name → token ids), with ``gen`` (CPU)."""
    check(1 <= position <= length, f"position: got {position}; valid positions are 1…{length}")
    for name, g in (("target_groups", target_group), ("disturbant_groups", disturbant_group)):
        check(g in pools, f"{name}: got {g!r}; valid values are {', '.join(pools)}")

    def draw(shape: tuple[int, ...], group: str) -> torch.Tensor:
        return pools[group][torch.randint(0, pools[group].numel(), shape, generator=gen)]

    p = position - 1
    base = draw((n, length), disturbant_group)
    target_idx = torch.randint(0, pools[target_group].numel(), (n,), generator=gen)
    base[:, p] = pools[target_group][target_idx]
    same_target = base.clone()
    same_target[:, p + 1:] = draw((n, length - p - 1), disturbant_group)
    same_suffix = base.clone()
    same_suffix[:, :p] = draw((n, p), disturbant_group)
    size = pools[target_group].numel()
    if size > 1:  # a different target from the same group
        shift = torch.randint(1, size, (n,), generator=gen)
        same_suffix[:, p] = pools[target_group][(target_idx + shift) % size]
    return torch.stack([base, same_target, same_suffix], dim=1)


def make_probes(n: int, length: int, position: int, vocab_size: int, conditions: list[tuple[str, str]],
                seed: int, pools: dict[str, torch.Tensor] | None = None) -> Probes:
    """``n`` triplets for each (target group, disturbant group) condition (balanced), seeded. Groups
    are the dual vocabulary's halves (:func:`vocabulary_groups`) unless ``pools`` gives others
    (e.g. :func:`frequency_groups` of a corpus)."""
    check(n >= 1, f"triplets: got {n}; need at least 1 per condition")
    pools = vocabulary_groups(vocab_size) if pools is None else pools
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.cat([make_triplets(n, length, position, pools, t, d, gen) for t, d in conditions])
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
