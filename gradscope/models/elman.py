"""Elman (tanh) RNN cell, functional form of ``nn.RNN``: h' = tanh(W_ih x + b_ih + W_hh h + b_hh)."""

from __future__ import annotations

import torch


def elman_cell(x: torch.Tensor, z: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor,
               b_ih: torch.Tensor, b_hh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One step. x (B, in), z = h (B, H) → (output h' (B, H), new state h' (B, H))."""
    h = torch.tanh(x @ w_ih.T + b_ih + z @ w_hh.T + b_hh)
    return h, h
