"""The sequence model shared by every core (docs/definitions.md §2).

``Embedding(K + 1, E)`` (row K is the output-phase query token) → optional positional encoding
(concatenated or added) → core → ``Linear(H, K)`` logits. Attribute names (``embedding``,
``time_encoder``, ``to_logits``) follow the paper's public code.

Two variants (:class:`~gradscope.models.config.ModelConfig`): vector inputs (the continuous task:
``embedding`` is ``Linear(d + 1, E)`` over the vector and a query flag, ``to_logits`` a point
prediction in R^d), and the feedback model (autoregressive decoding: ids K + 1 + y feed the token y
back through the same embedding, and ``phase`` adds a learned input-/output-phase vector).
"""

from __future__ import annotations

import torch
from torch import nn

from gradscope.models.config import ModelConfig
from gradscope.models.core import Core
from gradscope.models.pe import build_pe
from gradscope.models.registry import core_class


def build_core(cfg: ModelConfig) -> Core:
    """The registered core named by ``cfg.core``, built from the shared sizes and its own config."""
    return core_class(cfg.core).build(cfg.core_input_size, cfg.hidden_size, cfg.num_layers, cfg.core_config)


class SeqModel(nn.Module):
    """Token ids (B, T) → logits (B, T, K); vector inputs (B, T, d + 1) → predictions (B, T, d).
    ``config`` rebuilds the same architecture."""

    embedding: nn.Module

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        if cfg.inputs == "vectors":
            self.embedding = nn.Linear(cfg.vocab_size + 1, cfg.embed_size, bias=False)
        else:
            self.embedding = nn.Embedding(cfg.vocab_size + 1, cfg.embed_size)
        self.time_encoder = build_pe(cfg.pe, cfg.embed_size, cfg.max_len)
        if cfg.feedback:
            self.phase = nn.Embedding(2, cfg.embed_size)
        self.core = build_core(cfg)
        self.to_logits = nn.Linear(cfg.hidden_size, cfg.vocab_size)

    @property
    def query_token(self) -> int:
        return self.config.vocab_size

    def core_inputs(self, tokens: torch.Tensor) -> torch.Tensor:
        """The vectors the core reads: tokens (B, T) → (B, T, in), PE at t = 0 … T−1 included
        (vector inputs: (B, T, d + 1)). A feedback model reads id K + 1 + y as token y in the output
        phase; its phase vector is that of the output phase for ids ≥ K (the query and fed-back
        tokens) and of the input phase otherwise."""
        if self.config.feedback:
            K = self.config.vocab_size
            out_phase = tokens >= K  # (B, T)
            emb = self.embedding(torch.where(tokens > K, tokens - K - 1, tokens))  # (B, T, E)
            return torch.cat([self._positional(emb, tokens.shape[1]), self.phase(out_phase.long())], dim=-1)
        return self._positional(self.embedding(tokens), tokens.shape[1])

    def _positional(self, emb: torch.Tensor, length: int) -> torch.Tensor:
        """emb (B, T, E) with the PE of t = 0 … T−1 concatenated or added."""
        if self.config.pe == "none":
            return emb
        if self.config.pe == "dummy":
            pos = emb  # "double vanilla": the embedding itself stands where the PE would
        else:
            assert self.time_encoder is not None
            pos = self.time_encoder(length).to(emb.dtype).expand_as(emb)  # (B, T, E)
        if self.config.pe_combine == "concat":
            return torch.cat([emb, pos], dim=-1)
        return emb + pos

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Fused/FFT path used for training and evaluation. (B, T) → (B, T, K)."""
        return self.to_logits(self.core(self.core_inputs(tokens)))
