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


@dataclass(frozen=True)
class LSTMConfig(RNNConfig):
    """The LSTM core has no settings of its own."""


class LSTMCore(RNNCore):
    name: ClassVar[str] = "lstm"
    label: ClassVar[str] = "LSTM"
    fused: ClassVar[type[nn.RNNBase]] = nn.LSTM
    state_factor: ClassVar[int] = 2
    gates: ClassVar[tuple[str, ...]] = ("i", "f", "g", "o")
    Config: ClassVar[type] = LSTMConfig
    cell = staticmethod(lstm_cell)
    cell_vjp = staticmethod(lstm_vjp)
