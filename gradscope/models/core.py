"""The interface every sequence core implements, and the functional scan they share."""

from __future__ import annotations

import torch
from torch import nn


class Core(nn.Module):
    """A sequence core: fused ``forward`` for training, functional ``step`` for analysis.

    Subclasses define ``state_dim`` (D, real width of the full state z), ``out_dim`` (H),
    ``forward(x (B, T, in)) → (B, T, H)`` and ``step(x (B, in), z (B, D)) → (y (B, H), z' (B, D))``.
    """

    state_dim: int
    out_dim: int

    def step(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def init_state(self, batch: int, like: torch.Tensor) -> torch.Tensor:
        """The zero state (B, D), on ``like``'s device and dtype."""
        return like.new_zeros(batch, self.state_dim)

    def scan(self, x: torch.Tensor, z0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Functional recurrence. x (B, T, in) → (outputs (B, T, H), states after each step (B, T, D))."""
        z = self.init_state(x.shape[0], x) if z0 is None else z0
        ys, zs = [], []
        for t in range(x.shape[1]):
            y, z = self.step(x[:, t], z)
            ys.append(y)
            zs.append(z)
        return torch.stack(ys, dim=1), torch.stack(zs, dim=1)
