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


def _gru_coefficients(x: Tensor, h: Tensor, w: Weights) -> tuple[Tensor, ...]:
    """(u, c_r, c_u, a_n, r), each (B, H): the gate values and the row scales of ∂h'/∂(gate input)
    as in :func:`gru_vjp` (a_n = ∂h'/∂ pre-activation of n)."""
    w_ih, w_hh, b_ih, b_hh = w
    i_r, i_u, i_n = (x @ w_ih.T + b_ih).chunk(3, dim=-1)
    h_r, h_u, h_n = (h @ w_hh.T + b_hh).chunk(3, dim=-1)
    r, u = torch.sigmoid(i_r + h_r), torch.sigmoid(i_u + h_u)
    n = torch.tanh(i_n + r * h_n)
    a_n = (1 - u) * (1 - n * n)
    return u, a_n * h_n * r * (1 - r), (h - n) * u * (1 - u), a_n, r


def gru_jacobian(x: Tensor, h: Tensor, w: Weights, need_input: bool) -> tuple[Tensor, Tensor | None]:
    """∂h'/∂h = diag(u) + Σ_k diag(c_k) W_hk (B, H, H) (c_n = a_n·r, since r gates W_hn h) and, when
    asked, ∂h'/∂x = Σ_k diag(c_k) W_ik (B, H, in) (c_n = a_n: W_in x is not gated): ~6H² flops."""
    u, c_r, c_u, a_n, r = _gru_coefficients(x, h, w)
    jac = scaled_rows(torch.stack([c_r, c_u, a_n * r], dim=1), w[1])  # (B, H, H)
    jac.diagonal(dim1=1, dim2=2).add_(u)
    return jac, (scaled_rows(torch.stack([c_r, c_u, a_n], dim=1), w[0]) if need_input else None)


def gru_terms(x: Tensor, h: Tensor, w: Weights, need_input: bool) -> dict[str, tuple[Tensor, Tensor | None]]:
    """The cell Jacobian by path (docs/definitions.md §7): ``carry`` = diag(u) (h' = … + u ⊙ h; no input path),
    ``r`` = diag(c_r) W_hr, ``u`` = diag(c_u) W_hu, ``n`` = diag(a_n·r) W_hn; the input parts
    diag(c_r) W_ir, diag(c_u) W_iu, diag(a_n) W_in go with r, u, n."""
    u, c_r, c_u, a_n, r = _gru_coefficients(x, h, w)
    w_ih, w_hh = w[0].chunk(3), w[1].chunk(3)  # (W_r, W_u, W_n) blocks
    terms: dict[str, tuple[Tensor, Tensor | None]] = {"carry": (torch.diag_embed(u), None)}
    for k, (name, c_h, c_x) in enumerate([("r", c_r, c_r), ("u", c_u, c_u), ("n", a_n * r, a_n)]):
        terms[name] = (c_h[:, :, None] * w_hh[k], c_x[:, :, None] * w_ih[k] if need_input else None)
    return terms


@dataclass(frozen=True, kw_only=True)
class GRUConfig(RNNConfig):
    """The GRU core has no settings of its own."""


class GRUCore(RNNCore):
    name: ClassVar[str] = "gru"
    label: ClassVar[str] = "GRU"
    fused: ClassVar[type[nn.RNNBase]] = nn.GRU
    gates: ClassVar[tuple[str, ...]] = ("r", "u", "n")
    gate_names: ClassVar[tuple[str, ...]] = ("carry", "r", "u", "n")
    Config: ClassVar[type] = GRUConfig
    cell = staticmethod(gru_cell)
    cell_vjp = staticmethod(gru_vjp)
    cell_jacobian = staticmethod(gru_jacobian)
    cell_terms = staticmethod(gru_terms)
