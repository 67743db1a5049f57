"""GRU cell, functional form of ``nn.GRU`` (PyTorch gate order r, z, n)."""

from __future__ import annotations

import torch


def gru_cell(x: torch.Tensor, z: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor,
             b_ih: torch.Tensor, b_hh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One step. x (B, in), z = h (B, H) → (h', h').

    r = σ(.), u = σ(.) (PyTorch's z gate), n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)),
    h' = (1 − u) ⊙ n + u ⊙ h.
    """
    gi = x @ w_ih.T + b_ih  # (B, 3H)
    gh = z @ w_hh.T + b_hh  # (B, 3H)
    i_r, i_u, i_n = gi.chunk(3, dim=-1)
    h_r, h_u, h_n = gh.chunk(3, dim=-1)
    r = torch.sigmoid(i_r + h_r)
    u = torch.sigmoid(i_u + h_u)
    n = torch.tanh(i_n + r * h_n)
    h = (1 - u) * n + u * z
    return h, h
