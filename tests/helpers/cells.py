"""The recurrent cells' own tests share one oracle: a cell's weights at a given gate count, a random point, the
cell's Jacobians by torch.func.jacrev, and the checks that a hand-derived cell Jacobian and VJP equal them (all in
float64). tests/models/test_elman.py, test_gru.py and test_lstm.py use them with their own cell functions."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

F64 = torch.float64
IN, H, B, R = 3, 4, 2, 5  # input width, hidden width, sequences, VJP rows
TOL = 1e-12

Weights = tuple[Tensor, Tensor, Tensor, Tensor]


def weights(gates: int, seed: int = 0) -> Weights:
    """(W_ih (gates·H, in), W_hh (gates·H, H), b_ih, b_hh), W_hh at gain 2 so every gate is away from linear."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(gates * H, IN, generator=gen, dtype=F64),
            2 * torch.randn(gates * H, H, generator=gen, dtype=F64) / H ** 0.5,
            torch.randn(gates * H, generator=gen, dtype=F64), torch.randn(gates * H, generator=gen, dtype=F64))


def point(width: int = H, seed: int = 1) -> tuple[Tensor, Tensor]:
    """x (B, in) and a layer state (B, width)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, IN, generator=gen, dtype=F64), torch.randn(B, width, generator=gen, dtype=F64)


def cell_jacrev(cell: Callable[..., tuple[Tensor, Tensor]], x: Tensor, s: Tensor, w: Weights) -> tuple[Tensor, Tensor]:
    """The oracle: (∂s'/∂s (B, width, width), ∂s'/∂x (B, width, in)) of ``cell(x, s, *w) → (out, s')`` by
    torch.func, per sequence."""
    def one(x1: Tensor, s1: Tensor) -> Tensor:
        return cell(x1[None], s1[None], *w)[1][0]
    j_x, j_s = torch.func.vmap(torch.func.jacrev(one, argnums=(0, 1)))(x, s)
    return j_s, j_x


def load_torch_cell(ref: nn.Module, w: Weights) -> nn.Module:
    """``ref`` (nn.RNNCell, nn.GRUCell or nn.LSTMCell) with the weights ``w``."""
    with torch.no_grad():
        for p, v in zip((ref.weight_ih, ref.weight_hh, ref.bias_ih, ref.bias_hh), w):
            p.copy_(v)
    return ref


def check_jacobian(jacobian: Callable[..., tuple[Tensor, Tensor | None]], cell: Callable[..., tuple[Tensor, Tensor]],
                   w: Weights, width: int, need_input: bool) -> tuple[Tensor, Tensor]:
    """``jacobian(x, s, w, need_input)`` equals :func:`cell_jacrev`; returns the oracle's (∂s'/∂s, ∂s'/∂x)."""
    x, s = point(width)
    j_s, j_x = jacobian(x, s, w, need_input)
    ref_s, ref_x = cell_jacrev(cell, x, s, w)
    assert j_s.shape == (B, width, width)
    torch.testing.assert_close(j_s, ref_s, rtol=0, atol=TOL)
    if need_input:
        assert j_x is not None and j_x.shape == (B, width, IN)
        torch.testing.assert_close(j_x, ref_x, rtol=0, atol=TOL)
    else:
        assert j_x is None
    assert ref_s.abs().max() > 0.1 and ref_x.abs().max() > 0.1  # not a vacuous comparison
    return ref_s, ref_x


def check_vjp(vjp: Callable[..., Tensor | None], cell: Callable[..., tuple[Tensor, Tensor]], w: Weights, width: int,
              need_input: bool) -> None:
    """Rows g on s' → ``vjp(x, s, w, g, out, need_input)`` writes g · ∂s'/∂s into ``out`` and returns g · ∂s'/∂x
    when asked (None otherwise); g is a spent buffer it may overwrite."""
    x, s = point(width)
    g = torch.randn(B, R, width, generator=torch.Generator().manual_seed(2), dtype=F64)
    out = torch.full((B, R, width), float("nan"), dtype=F64)
    rows_x = vjp(x, s, w, g.clone(), out, need_input)
    ref_s, ref_x = cell_jacrev(cell, x, s, w)
    torch.testing.assert_close(out, g @ ref_s, rtol=0, atol=TOL)
    if need_input:
        assert rows_x is not None
        torch.testing.assert_close(rows_x, g @ ref_x, rtol=0, atol=TOL)
    else:
        assert rows_x is None
