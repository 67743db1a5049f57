"""Token sampling: uniform, or dual-frequency (docs/definitions.md §3).

Dual-frequency: the lower half [0, K//2) is Frequent, the upper half [K//2, K) Rare. Each position
is Rare with probability ``rarity`` (default 1/8: each Frequent token is 7× as likely as each Rare
one when the halves are equal), then uniform within its group.
"""

from __future__ import annotations

import torch

FREQUENT, RARE = 0, 1
GROUP_NAMES = ("frequent", "rare")


def group_bounds(vocab_size: int, group: int) -> tuple[int, int]:
    """[low, high) token range of ``group`` (FREQUENT or RARE) in a vocabulary of K tokens."""
    half = vocab_size // 2
    return (0, half) if group == FREQUENT else (half, vocab_size)


def group_size(vocab_size: int, group: int) -> int:
    low, high = group_bounds(vocab_size, group)
    return high - low


def sample_group(shape: tuple[int, ...], vocab_size: int, group: int, gen: torch.Generator) -> torch.Tensor:
    """Tokens drawn uniformly from one frequency group. Long tensor of ``shape`` on gen's device."""
    low, high = group_bounds(vocab_size, group)
    return torch.randint(low, high, shape, generator=gen, device=gen.device)


def sample_tokens(shape: tuple[int, ...], vocab_size: int, distribution: str, rarity: float,
                  gen: torch.Generator) -> torch.Tensor:
    """Tokens from the task's vocabulary distribution ('uniform' or 'dual'). Long tensor of ``shape``."""
    if distribution == "uniform":
        return torch.randint(0, vocab_size, shape, generator=gen, device=gen.device)
    half = vocab_size // 2
    rare = torch.rand(shape, generator=gen, device=gen.device) < rarity
    frequent_tok = torch.randint(0, half, shape, generator=gen, device=gen.device)
    rare_tok = torch.randint(half, vocab_size, shape, generator=gen, device=gen.device)
    return torch.where(rare, rare_tok, frequent_tok)


def token_weights(vocab_size: int, distribution: str, rarity: float) -> torch.Tensor:
    """Per-token probabilities (K,) of one draw (used for sampling without replacement)."""
    if distribution == "uniform":
        return torch.full((vocab_size,), 1.0 / vocab_size)
    half = vocab_size // 2
    w = torch.empty(vocab_size)
    w[:half] = (1 - rarity) / half
    w[half:] = rarity / (vocab_size - half)
    return w
