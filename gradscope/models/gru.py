"""GRU core: ``nn.GRU``, its functional cell (PyTorch gate order r, z, n) and its analytic step VJP.

r = σ(.), u = σ(.) (PyTorch's z gate), n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)),
h' = (1 − u) ⊙ n + u ⊙ h; one H-wide state per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from gradscope.models.core import scaled_rows
from gradscope.models.rnn import RNNConfig, RNNCore, Weights


def gru_cell(x: Tensor, z: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor) -> tuple[Tensor, Tensor]:
    """One step. x (B, in), z = h (B, H) → (h', h')."""
    gi = x @ w_ih.T + b_ih  # (B, 3H)
    gh = z @ w_hh.T + b_hh  # (B, 3H)
    i_r, i_u, i_n = gi.chunk(3, dim=-1)
    h_r, h_u, h_n = gh.chunk(3, dim=-1)
    r = torch.sigmoid(i_r + h_r)
    u = torch.sigmoid(i_u + h_u)
    n = torch.tanh(i_n + r * h_n)
    h = (1 - u) * n + u * z
    return h, h


def gru_vjp(x: Tensor, h: Tensor, w: Weights, g: Tensor, out: Tensor, need_input: bool) -> Tensor | None:
    """Rows g (B, R, H) on h' → rows on h in ``out``. ∂h'/∂h = diag(u) + Σ_k diag(c_k) W_hk is formed
    in O(H²) and applied with one bmm: H³ per step, where jacrev pays 3H³ (the stacked W_hh)."""
    w_ih, w_hh, b_ih, b_hh = w
    i_r, i_u, i_n = (x @ w_ih.T + b_ih).chunk(3, dim=-1)
    h_r, h_u, h_n = (h @ w_hh.T + b_hh).chunk(3, dim=-1)
    r, u = torch.sigmoid(i_r + h_r), torch.sigmoid(i_u + h_u)
    n = torch.tanh(i_n + r * h_n)
    a_n = (1 - u) * (1 - n * n)  # ∂h'/∂(pre-activation of n)
    c_r, c_u = a_n * h_n * r * (1 - r), (h - n) * u * (1 - u)
    jac = scaled_rows(torch.stack([c_r, c_u, a_n * r], dim=1), w_hh)  # (B, H, H)
    jac.diagonal(dim1=1, dim2=2).add_(u)
    torch.bmm(g, jac, out=out)
    return torch.bmm(g, scaled_rows(torch.stack([c_r, c_u, a_n], dim=1), w_ih)) if need_input else None


@dataclass(frozen=True)
class GRUConfig(RNNConfig):
    """The GRU core has no settings of its own."""


class GRUCore(RNNCore):
    name: ClassVar[str] = "gru"
    label: ClassVar[str] = "GRU"
    fused: ClassVar[type[nn.RNNBase]] = nn.GRU
    gates: ClassVar[tuple[str, ...]] = ("r", "u", "n")
    Config: ClassVar[type] = GRUConfig
    cell = staticmethod(gru_cell)
    cell_vjp = staticmethod(gru_vjp)
