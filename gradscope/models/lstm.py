"""LSTM cell, functional form of ``nn.LSTM`` (PyTorch gate order i, f, g, o; cell size H)."""

from __future__ import annotations

import torch


def lstm_cell(x: torch.Tensor, z: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor,
              b_ih: torch.Tensor, b_hh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One step. x (B, in), z = concat(h, c) (B, 2H) → (h' (B, H), concat(h', c') (B, 2H))."""
    h, c = z.chunk(2, dim=-1)
    gates = x @ w_ih.T + b_ih + h @ w_hh.T + b_hh  # (B, 4H)
    i, f, g, o = gates.chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h, torch.cat([h, c], dim=-1)
