"""Elman (tanh) RNN core: ``nn.RNN``, its functional cell and its analytic step VJP.

h' = tanh(W_ih x + b_ih + W_hh h + b_hh); one H-wide state per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from gradscope.models.rnn import RNNConfig, RNNCore, Weights


def elman_cell(x: Tensor, z: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor) -> tuple[Tensor, Tensor]:
    """One step. x (B, in), z = h (B, H) → (output h' (B, H), new state h' (B, H))."""
    h = torch.tanh(x @ w_ih.T + b_ih + z @ w_hh.T + b_hh)
    return h, h


def elman_vjp(x: Tensor, h: Tensor, w: Weights, g: Tensor, out: Tensor, need_input: bool) -> Tensor | None:
    """Rows g (B, R, H) on h' → rows on h in ``out``. J = diag(1 − h'²) W_hh: scaling the cotangent
    columns and one shared GEMM is cheapest (H³ per step and sequence)."""
    w_ih, w_hh, b_ih, b_hh = w
    h_new = torch.tanh(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh)  # (B, H)
    ga = g.mul_((1 - h_new * h_new)[:, None, :])  # (B, R, H)
    torch.matmul(ga, w_hh, out=out)
    return ga @ w_ih if need_input else None


def elman_jacobian(x: Tensor, h: Tensor, w: Weights, need_input: bool) -> tuple[Tensor, Tensor | None]:
    """∂h'/∂h = diag(1 − h'²) W_hh (B, H, H) and, when asked, ∂h'/∂x = diag(1 − h'²) W_ih (B, H, in):
    H² multiplications after the step's own preactivation."""
    w_ih, w_hh, b_ih, b_hh = w
    h_new = torch.tanh(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh)  # (B, H)
    a = (1 - h_new * h_new)[:, :, None]  # (B, H, 1): tanh'
    return a * w_hh, (a * w_ih if need_input else None)


def elman_terms(x: Tensor, h: Tensor, w: Weights, need_input: bool) -> dict[str, tuple[Tensor, Tensor | None]]:
    """One path: ``h`` owns all of the cell Jacobian."""
    return {"h": elman_jacobian(x, h, w, need_input)}


@dataclass(frozen=True, kw_only=True)
class ElmanConfig(RNNConfig):
    """The Elman core has no settings of its own."""


class ElmanCore(RNNCore):
    name: ClassVar[str] = "elman"
    label: ClassVar[str] = "Elman RNN"
    fused: ClassVar[type[nn.RNNBase]] = nn.RNN
    gates: ClassVar[tuple[str, ...]] = ("h",)
    gate_names: ClassVar[tuple[str, ...]] = ("h",)
    Config: ClassVar[type] = ElmanConfig
    cell = staticmethod(elman_cell)
    cell_vjp = staticmethod(elman_vjp)
    cell_jacobian = staticmethod(elman_jacobian)
    cell_terms = staticmethod(elman_terms)
