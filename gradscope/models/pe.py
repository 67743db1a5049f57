"""Positional encodings (docs/definitions.md §2). Time index t counts on through input and output phases.

A PE kind is a module class with ``name``, ``build(dim, max_len)`` and ``numbers(dim, max_len)`` (the
numbers it holds, for memory estimates), and one line in :data:`PE_TYPES`; ``none`` and ``dummy``
have no module (:class:`~gradscope.models.seq.SeqModel` handles them).

State-dict names follow the paper's public code so its checkpoints import by prefix only:
``time_encoder.frequencies`` (sinusoidal buffer), ``time_encoder.embeddings`` (learnable parameter
or random fixed buffer). The ``dummy`` kind has no module: the model duplicates its embedding.
"""

from __future__ import annotations

import math

import torch
from typing import ClassVar

from torch import nn

from gradscope.errors import check


def sinusoidal_frequencies(dim: int) -> torch.Tensor:
    """ω_i = 10000^(−2i/dim), i = 0 … dim/2 − 1.  Shape (dim/2,)."""
    return torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))


class SinusoidalPE(nn.Module):
    """[sin(ω t)…, cos(ω t)…] / sqrt(dim/2): every vector has unit L2 norm (blocked layout)."""

    name: ClassVar[str] = "sinusoidal"

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("frequencies", sinusoidal_frequencies(dim).float())

    @classmethod
    def build(cls, dim: int, max_len: int) -> "SinusoidalPE":
        return cls(dim)

    @staticmethod
    def numbers(dim: int, max_len: int) -> int:
        return dim // 2

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

    @staticmethod
    def numbers(dim: int, max_len: int) -> int:
        return dim * max_len


class LearnablePE(TablePE):
    """A learnable N(0, 1) position table."""

    name: ClassVar[str] = "learnable"

    @classmethod
    def build(cls, dim: int, max_len: int) -> "LearnablePE":
        return cls(dim, max_len, learnable=True)


class RandomPE(TablePE):
    """A fixed table of random unit-norm rows."""

    name: ClassVar[str] = "random"

    @classmethod
    def build(cls, dim: int, max_len: int) -> "RandomPE":
        return cls(dim, max_len, learnable=False)


# The PE registry: kind → module class (None: no module). Adding a kind = a class + one line here.
PE_TYPES: dict[str, type[nn.Module] | None] = {
    "none": None,
    "sinusoidal": SinusoidalPE,
    "learnable": LearnablePE,
    "random": RandomPE,
    "dummy": None,  # "double vanilla": the embedding itself stands where the PE would
}


def build_pe(kind: str, dim: int, max_len: int) -> nn.Module | None:
    """The PE module for ``kind`` (None for ``none`` and ``dummy``)."""
    cls = PE_TYPES[kind]
    return None if cls is None else cls.build(dim, max_len)  # type: ignore[attr-defined]


def reads_max_len(kind: str) -> bool:
    """Whether the PE of ``kind`` holds a table of ``max_len`` positions (learnable, random)."""
    cls = PE_TYPES[kind]
    return cls is not None and issubclass(cls, TablePE)


def pe_numbers(kind: str, dim: int, max_len: int) -> int:
    """The numbers the PE of ``kind`` holds (a position table: max_len × dim)."""
    cls = PE_TYPES[kind]
    return 0 if cls is None else int(cls.numbers(dim, max_len))  # type: ignore[attr-defined]
