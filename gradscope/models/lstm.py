"""LSTM core: ``nn.LSTM`` (cell size H), its functional cell (PyTorch gate order i, f, g, o) and its
analytic step VJP. One layer's state is [h, c] (2H values)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from gradscope.models.core import scaled_rows
from gradscope.models.rnn import RNNConfig, RNNCore, Weights


def lstm_cell(x: Tensor, z: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor) -> tuple[Tensor, Tensor]:
    """One step. x (B, in), z = concat(h, c) (B, 2H) → (h' (B, H), concat(h', c') (B, 2H))."""
    h, c = z.chunk(2, dim=-1)
    gates = x @ w_ih.T + b_ih + h @ w_hh.T + b_hh  # (B, 4H)
    i, f, g, o = gates.chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h, torch.cat([h, c], dim=-1)


def lstm_vjp(x: Tensor, s: Tensor, w: Weights, g: Tensor, out: Tensor, need_input: bool) -> Tensor | None:
    """Rows g (B, R, 2H) on [h', c'] → rows on [h, c] in ``out``. ∂c'/∂c and ∂h'/∂c are diagonal, so
    a step is one (R × 2H)·(2H × H) bmm: 2H³ per step, where jacrev pays 4H³."""
    w_ih, w_hh, b_ih, b_hh = w
    H = s.shape[-1] // 2
    h, c = s.chunk(2, dim=-1)
    i, f, cand, o = (x @ w_ih.T + b_ih + h @ w_hh.T + b_hh).chunk(4, dim=-1)
    i, f, cand, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(cand), torch.sigmoid(o)
    tc = torch.tanh(f * c + i * cand)
    g_h, g_c = g[..., :H], g[..., H:]  # (B, R, H) each
    g_c.addcmul_(g_h, (o * (1 - tc * tc))[:, None, :])  # now the total cotangent on c'
    torch.mul(g_c, f[:, None, :], out=out[..., H:])  # ∂c'/∂c = diag(f); ∂h'/∂c goes through c'
    # Rows on h: [g_h, g_c] · [∂h'/∂h|_o ; ∂c'/∂h], with ∂h'/∂h|_o = diag(tc·o(1−o)) W_ho and
    # ∂c'/∂h = Σ_{i,f,g} diag(·) W_h·.
    coef = torch.stack([cand * i * (1 - i), c * f * (1 - f), i * (1 - cand * cand)], dim=1)  # (B, 3, H)
    c_o = (tc * o * (1 - o))[:, :, None]  # (B, H, 1)
    lhs = g.contiguous()

    def pull(w_: Tensor) -> Tensor:
        m = w_.new_empty(g.shape[0], 2 * H, w_.shape[1])  # (B, 2H, n)
        torch.mul(c_o, w_[3 * H:], out=m[:, :H])
        scaled_rows(coef, w_[:3 * H], out=m[:, H:])
        return torch.bmm(lhs, m)

    out[..., :H] = pull(w_hh)
    return pull(w_ih) if need_input else None


def _lstm_coefficients(x: Tensor, s: Tensor, w: Weights) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(f (B, H), coef (B, 3, H) = ∂c'/∂ pre-activations of i, f, g, c_o (B, H) = ∂h'/∂ pre-activation
    of o, k (B, H) = ∂h'/∂c' = o(1 − tanh²c')), as in :func:`lstm_vjp`."""
    w_ih, w_hh, b_ih, b_hh = w
    h, c = s.chunk(2, dim=-1)
    i, f, cand, o = (x @ w_ih.T + b_ih + h @ w_hh.T + b_hh).chunk(4, dim=-1)
    i, f, cand, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(cand), torch.sigmoid(o)
    tc = torch.tanh(f * c + i * cand)
    coef = torch.stack([cand * i * (1 - i), c * f * (1 - f), i * (1 - cand * cand)], dim=1)
    return f, coef, tc * o * (1 - o), o * (1 - tc * tc)


def _gate_rows(coef: Tensor, c_o: Tensor, k: Tensor, w_: Tensor) -> tuple[Tensor, Tensor]:
    """(∂h', ∂c'), each (B, H, n), with respect to what ``w_`` (4H, n) reads (h or x), through all
    four gates: ∂c' = Σ_{i,f,g} diag(coef) W_·, ∂h' = diag(c_o) W_o + diag(k) ∂c'. No ``out=``
    buffers, so it stays differentiable."""
    H = k.shape[-1]
    d_c = scaled_rows(coef, w_[:3 * H])
    return torch.addcmul(c_o[:, :, None] * w_[3 * H:], k[:, :, None], d_c), d_c


def lstm_jacobian(x: Tensor, s: Tensor, w: Weights, need_input: bool) -> tuple[Tensor, Tensor | None]:
    """On [h, c]: ∂c'/∂c = diag(f), ∂h'/∂c = diag(k·f), [∂h'/∂h; ∂c'/∂h] through W_hh's four gates
    → (B, 2H, 2H), and the same rows through W_ih → (B, 2H, in) when asked. ~8H² flops for the h
    columns; the c columns are two diagonals."""
    f, coef, c_o, k = _lstm_coefficients(x, s, w)
    H = f.shape[-1]
    jac = s.new_zeros(s.shape[0], 2 * H, 2 * H)
    jac[:, :H, :H], jac[:, H:, :H] = _gate_rows(coef, c_o, k, w[1])
    jac[:, :H, H:].diagonal(dim1=1, dim2=2).copy_(k * f)
    jac[:, H:, H:].diagonal(dim1=1, dim2=2).copy_(f)
    return jac, (torch.cat(_gate_rows(coef, c_o, k, w[0]), dim=1) if need_input else None)


def lstm_terms(x: Tensor, s: Tensor, w: Weights, need_input: bool) -> dict[str, tuple[Tensor, Tensor | None]]:
    """The cell Jacobian on [h, c] by path. ``forget`` owns the c columns: diag(f) on c → c' and its
    share diag(k·f) in ∂h'/∂c (the carry through c; no input path). The h columns (and the input
    parts) go to the gate whose pre-activation they pass: ``i``, ``f``, ``g`` own the rows
    [diag(k·coef) W_h· ; diag(coef) W_h·] (their path into c', then on to h'), ``o`` owns
    diag(c_o) W_ho in the h rows only. (``f`` is the forget gate's own path through W_hf, which the
    carry ``forget`` does not include.)"""
    f, coef, c_o, k = _lstm_coefficients(x, s, w)
    B, H = f.shape
    carry = s.new_zeros(B, 2 * H, 2 * H)
    carry[:, :H, H:].diagonal(dim1=1, dim2=2).copy_(k * f)
    carry[:, H:, H:].diagonal(dim1=1, dim2=2).copy_(f)
    terms: dict[str, tuple[Tensor, Tensor | None]] = {"forget": (carry, None)}
    w_ih, w_hh = w[0].chunk(4), w[1].chunk(4)  # (W_i, W_f, W_g, W_o) blocks

    def path(j: int, w_k: Tensor, width: int) -> Tensor:
        """Gate j's path from what w_k (H, n) reads → (B, 2H, width), zero beyond column n."""
        term, cols = s.new_zeros(B, 2 * H, width), slice(0, w_k.shape[1])
        if j == 3:  # o reaches h' only, not c'
            term[:, :H, cols] = c_o[:, :, None] * w_k
        else:  # i, f, g reach h' only through c': h rows = diag(k) · c rows
            term[:, H:, cols] = coef[:, j, :, None] * w_k
            term[:, :H, cols] = k[:, :, None] * term[:, H:, cols]
        return term

    for j, name in enumerate(("i", "f", "g", "o")):
        terms[name] = (path(j, w_hh[j], 2 * H), path(j, w_ih[j], w_ih[j].shape[1]) if need_input else None)
    return terms


@dataclass(frozen=True, kw_only=True)
class LSTMConfig(RNNConfig):
    """The LSTM core has no settings of its own."""


class LSTMCore(RNNCore):
    name: ClassVar[str] = "lstm"
    label: ClassVar[str] = "LSTM"
    fused: ClassVar[type[nn.RNNBase]] = nn.LSTM
    state_factor: ClassVar[int] = 2
    gates: ClassVar[tuple[str, ...]] = ("i", "f", "g", "o")
    gate_names: ClassVar[tuple[str, ...]] = ("forget", "i", "f", "g", "o")
    Config: ClassVar[type] = LSTMConfig
    cell = staticmethod(lstm_cell)
    cell_vjp = staticmethod(lstm_vjp)
    cell_jacobian = staticmethod(lstm_jacobian)
    cell_terms = staticmethod(lstm_terms)
