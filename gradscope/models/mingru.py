"""minGRU (Feng et al. 2024, "Were RNNs All We Needed?", §3.1): a GRU whose gate and candidate read
only the input, so that training can run as a parallel scan.

Per layer l (layer 1 reads the core's input, layer l + 1 reads layer l's new h):
u_t = σ(W_u a_t + b_u), h̃_t = W_h a_t + b_h, h_t = (1 − u_t) ⊙ h_{t−1} + u_t ⊙ h̃_t.
The state is every layer's h, layer 1 first; the output is the top layer's h.

Step Jacobian: layer l's own block is diag(1 − u_t) (the old h enters only through the carry), and
below the diagonal layer l reads layer l − 1's new h through its input a_t:
∂h_l/∂a = diag(u (1 − u) ⊙ (h̃ − h_{t−1})) W_u + diag(u) W_h. So J_t is block lower-triangular with
diagonal blocks (:mod:`gradscope.models.structure`), and each layer's Lyapunov exponents are the time
averages of log(1 − u_t) per unit: exact, O(D) a step.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from gradscope.models.core import Core
from gradscope.models.structure import JacobianStructure, StateBlock


class MinGRUCore(Core):
    """``num_layers`` minGRU layers, each one ``Linear(in, 2H)`` (gate rows first, then candidate)."""

    name: ClassVar[str] = "mingru"
    label: ClassVar[str] = "minGRU"
    tiny_config: ClassVar[dict[str, Any]] = {}

    def __init__(self, input_size: int, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        self.hidden_size, self.num_layers = hidden_size, num_layers
        self.layers = nn.ModuleList(nn.Linear(input_size if layer == 0 else hidden_size, 2 * hidden_size)
                                    for layer in range(num_layers))

    @classmethod
    def build(cls, input_size: int, hidden_size: int, num_layers: int, config: object) -> "MinGRUCore":
        return cls(input_size, hidden_size, num_layers)

    @property
    def state_dim(self) -> int:  # type: ignore[override]
        return self.hidden_size * self.num_layers

    @property
    def out_dim(self) -> int:  # type: ignore[override]
        return self.hidden_size

    def state_layout(self) -> dict[str, slice]:
        H = self.hidden_size
        return {f"h{layer + 1}": slice(layer * H, (layer + 1) * H) for layer in range(self.num_layers)}

    def forward(self, x: Tensor) -> Tensor:
        """Training path: each layer's projections for all steps at once, then the elementwise
        recurrence. x (B, T, in) → top-layer h (B, T, H)."""
        a = x
        for lin in self.layers:
            gate, cand = lin(a).chunk(2, dim=-1)
            u = torch.sigmoid(gate)
            h = a.new_zeros(a.shape[0], self.hidden_size)
            out = []
            for c_t, u_t in zip(cand.unbind(1), u.unbind(1)):  # unbind: one backward for all steps
                h = torch.lerp(h, c_t, u_t)  # (1 − u) h + u h̃
                out.append(h)
            a = torch.stack(out, dim=1)
        return a

    def _layer(self, lin: nn.Linear, a: Tensor, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        gate, cand = lin(a).chunk(2, dim=-1)
        u = torch.sigmoid(gate)
        return torch.lerp(h, cand, u), u, cand

    def step(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, in), z (B, D) → (top h (B, H), z' (B, D))."""
        a, new = x, []
        for lin, h in zip(self.layers, z.split(self.hidden_size, dim=-1)):
            a = self._layer(lin, a, h)[0]
            new.append(a)
        return a, torch.cat(new, dim=-1)

    def readout(self, x: Tensor, z: Tensor) -> Tensor:
        """The top layer's h. x (B, in) unused, z (B, D) → (B, H)."""
        return z[:, self.state_dim - self.hidden_size:]

    def jacobian_structure(self) -> JacobianStructure:
        """One diagonal block per layer; layer l + 1 reads layer l's new h: lower-triangular."""
        H = self.hidden_size
        return JacobianStructure(tuple(StateBlock(f"h{layer + 1}", layer * H, (layer + 1) * H, "diagonal")
                                       for layer in range(self.num_layers)))

    def diagonal_blocks(self, x: Tensor, z: Tensor) -> list[Tensor]:
        """Each layer's own block, diag(1 − u_t), compact (B, H)."""
        a, out = x, []
        for lin, h in zip(self.layers, z.split(self.hidden_size, dim=-1)):
            a, u, _ = self._layer(lin, a, h)
            out.append(1 - u)
        return out

    def step_jacobian(self, x: Tensor, z: Tensor) -> Tensor:
        """J_t (B, D, D): diag(1 − u) on each layer's own block; below it, ∂h_l/∂a · (layer l − 1's rows)."""
        B, H, D = x.shape[0], self.hidden_size, self.state_dim
        J = z.new_zeros(B, D, D)
        a, below = x, None  # below: ∂a/∂z (B, H, D) for layers above the first
        for layer, (lin, h) in enumerate(zip(self.layers, z.split(H, dim=-1))):
            new, u, cand = self._layer(lin, a, h)
            rows = slice(layer * H, (layer + 1) * H)
            if below is not None:
                w_u, w_h = lin.weight[:H], lin.weight[H:]  # (H, H) each
                da = (u * (1 - u) * (cand - h))[:, :, None] * w_u + u[:, :, None] * w_h  # ∂h_l/∂a (B, H, H)
                J[:, rows] = da @ below
            J[:, rows, rows] += torch.diag_embed(1 - u)
            below, a = J[:, rows], new
        return J
