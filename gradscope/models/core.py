"""The core protocol every recurrent core follows, and the functional scan they share.

A *core* is an ``nn.Module`` with

- ``state_dim`` (D): the real width of the full recurrent state z (every layer; LSTM h and c;
  complex SSM states as real numbers, ``torch.view_as_real`` layout);
- ``out_dim`` (H): the width of the output y_t;
- ``step(x (B, in), z (B, D)) → (y (B, H), z' (B, D))``: one functional step on the flat real state.

That is all the generic Jacobian engines (``vjp``, ``func``) need; any module with these three works
with them, whoever wrote it. A core may also provide, and gradscope's own cores do:

- ``readout(x, z)``: y_t from the state z_t right after step t and that step's input x_t (needed
  for a Jacobian at p = T);
- ``state_layout()``: names of the slices of z (``h1``, ``c1``, ``modes1`` …), for labels;
- ``complex_state``: True when z is the real view of complex numbers (S4D), which adds the
  conjugate-Wirtinger scores;
- ``analytic_unsupported()`` / ``analytic_jacobian(x, zs, p)``: a fast hand-derived engine.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn


class Core(nn.Module):
    """Base class of gradscope's cores: defaults for the optional parts of the protocol."""

    name: ClassVar[str] = "core"  # registry name
    label: ClassVar[str] = "core"  # how reports write it
    complex_state: ClassVar[bool] = False
    state_dim: int
    out_dim: int

    def step(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def readout(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y_t from z_t (B, D) and x_t (B, in) → (B, H). Cores without one cannot be analysed at p = T."""
        raise NotImplementedError

    def state_layout(self) -> dict[str, slice]:
        """Named slices of the flat state z."""
        return {"z": slice(0, self.state_dim)}

    def analytic_unsupported(self) -> str | None:
        """Why the analytic engine cannot handle this core (None when it can)."""
        return f"it does not know {type(self).__name__}"

    def analytic_jacobian(self, x: torch.Tensor, zs: torch.Tensor, p: int) -> torch.Tensor:
        """J = ∂y_T/∂z_p from the inputs x (B, T, in) and scanned states zs (B, T, D) → (B, H, D)."""
        raise NotImplementedError

    def init_state(self, batch: int, like: torch.Tensor) -> torch.Tensor:
        """The zero state (B, D), on ``like``'s device and dtype."""
        return like.new_zeros(batch, self.state_dim)

    def scan(self, x: torch.Tensor, z0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`scan` of this core."""
        return scan(self, x, z0)


def scan(core: nn.Module, x: torch.Tensor, z0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Functional recurrence of any protocol core. x (B, T, in) → (outputs (B, T, H), states after
    each step (B, T, D)). The state starts at ``z0``, else at zero."""
    z = x.new_zeros(x.shape[0], core.state_dim) if z0 is None else z0
    ys, zs = [], []
    for t in range(x.shape[1]):
        y, z = core.step(x[:, t], z)
        ys.append(y)
        zs.append(z)
    return torch.stack(ys, dim=1), torch.stack(zs, dim=1)


def scaled_rows(coef: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Σ_k diag(coef[:, k]) W_k: coef (B, K, H), w (K·H, n) → (B, H, n), formed elementwise."""
    blocks = w.view(coef.shape[1], coef.shape[2], -1)  # (K, H, n)
    out = torch.mul(coef[:, 0, :, None], blocks[0], out=out)
    for k in range(1, coef.shape[1]):
        out.addcmul_(coef[:, k, :, None], blocks[k])
    return out
