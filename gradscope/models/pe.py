"""Positional encodings (SPEC §2). Time index t counts on through input and output phases.

State-dict names follow the paper's public code so its checkpoints import by prefix only:
``time_encoder.frequencies`` (sinusoidal buffer), ``time_encoder.embeddings`` (learnable parameter
or random fixed buffer). The ``dummy`` kind has no module: the model duplicates its embedding.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gradscope.errors import check


def sinusoidal_frequencies(dim: int) -> torch.Tensor:
    """ω_i = 10000^(−2i/dim), i = 0 … dim/2 − 1.  Shape (dim/2,)."""
    return torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))


class SinusoidalPE(nn.Module):
    """[sin(ω t)…, cos(ω t)…] / sqrt(dim/2): every vector has unit L2 norm (blocked layout)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("frequencies", sinusoidal_frequencies(dim).float())

    def forward(self, length: int) -> torch.Tensor:
        t = torch.arange(length, device=self.frequencies.device, dtype=self.frequencies.dtype)
        angle = t[:, None] * self.frequencies[None, :]  # (T, dim/2)
        return torch.cat([angle.sin(), angle.cos()], dim=-1) / math.sqrt(angle.shape[-1])  # (T, dim)


class TablePE(nn.Module):
    """A position table of ``max_len`` rows: learnable N(0,1), or fixed random unit-norm rows."""

    def __init__(self, dim: int, max_len: int, learnable: bool) -> None:
        super().__init__()
        table = torch.randn(max_len, dim)
        if learnable:
            self.embeddings = nn.Parameter(table)
        else:
            self.register_buffer("embeddings", nn.functional.normalize(table, p=2.0, dim=-1))

    def forward(self, length: int) -> torch.Tensor:
        check(length <= self.embeddings.shape[0],
              f"sequence length: got {length}; this model's positional table covers "
              f"{self.embeddings.shape[0]} positions (max_len)")
        return self.embeddings[:length]  # (T, dim)


def build_pe(kind: str, dim: int, max_len: int) -> nn.Module | None:
    """The PE module for ``kind`` (None for ``none`` and ``dummy``)."""
    table = {
        "sinusoidal": lambda: SinusoidalPE(dim),
        "learnable": lambda: TablePE(dim, max_len, learnable=True),
        "random": lambda: TablePE(dim, max_len, learnable=False),
    }
    return table[kind]() if kind in table else None
