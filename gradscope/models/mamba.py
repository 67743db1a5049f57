"""A selective state-space core in the style of Mamba (Gu & Dao 2023, Algorithm 2 and §3.4): per
layer, with the residual stream u (width H):

    a, g = split(in_proj(RMSNorm(u)))                 a, g: (E,), E = expand·H
    w_t = [w_{t−1}[1:], a]                              the causal conv's window (K inputs)
    c = SiLU(Σ_k conv_k ⊙ w_t[k] + conv_bias)           depthwise causal convolution
    Δ = softplus(dt_proj(x_proj_Δ(c))), B = x_proj_B(c), C = x_proj_C(c)   input-dependent
    s_t = exp(Δ A) ⊙ s_{t−1} + (Δ c) ⊗ B               A = −exp(A_log) (E, N), diagonal
    y = (s_t C + D ⊙ c) ⊙ SiLU(g);  u ← u + out_proj(y)

The core is ``Linear(in, H)`` then ``num_layers`` such layers; its output is the residual stream.
The state of a layer is its conv window w (E × K, channel-major, the newest input last) and its
SSM state s (E × N). The oldest window entry is kept only so that the output can be read back from
the state after a step (``readout``); the next step never reads it (its column of J_t is zero).

Step Jacobian: within a layer, the window is a shift (each channel's K × K block has ones on the
superdiagonal: nilpotent, so its K exponents are −∞), and s_t reads s_{t−1} only through exp(Δ A),
a diagonal; s_t also reads the old window through c, Δ and B, and a layer reads the layers below
through u. Ordered window before SSM state, layer by layer, J_t is block lower-triangular with a
per-channel block-diagonal block (the shifts) and a diagonal block (exp(Δ A)) per layer
(:mod:`gradscope.models.structure`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from gradscope.errors import check
from gradscope.fields import DT_MAX, DT_MIN, check_fields, option
from gradscope.models.core import Core
from gradscope.models.structure import JacobianStructure, StateBlock


@dataclass(frozen=True, kw_only=True)
class MambaConfig:
    """The selective SSM's own settings. Defaults are smaller than the Mamba paper's N = 16 and
    expand 2 (K = 4 is the paper's), so that the CPU-scale study trains on a laptop: at H = 128,
    batch 128, T = 32, one thread, an iteration with N = 16, expand 2 took 4.5× as long as with
    N = 8, expand 1 (0.82 s against 0.18 s on this workplace's 2-core CPU, other jobs running)."""

    state_size: int = option(8, "State size N (real modes per inner channel).", short="N", alias="state", low=1)
    expand: int = option(1, "Inner width E = expand × H.", short="expand", alias="expand", low=1)
    conv_width: int = option(4, "Width K of the causal depthwise convolution.", short="K_conv", alias="conv", low=2)
    dt_min: float = DT_MIN
    dt_max: float = DT_MAX

    def __post_init__(self) -> None:
        check_fields(self)  # the ranges declared on the fields
        check(0 < self.dt_min <= self.dt_max, f"dt_min/dt_max: got {self.dt_min}/{self.dt_max}; need 0 < dt_min <= dt_max")


class MambaLayer(nn.Module):
    """One selective-SSM layer on a residual stream of width H."""

    def __init__(self, hidden: int, inner: int, state: int, width: int, dt_min: float, dt_max: float) -> None:
        super().__init__()
        self.inner, self.state, self.width = inner, state, width
        self.rank = math.ceil(hidden / 16)
        self.norm = nn.RMSNorm(hidden)
        self.in_proj = nn.Linear(hidden, 2 * inner)
        self.conv = nn.Conv1d(inner, inner, width, groups=inner, padding=width - 1)
        self.x_proj = nn.Linear(inner, self.rank + 2 * state, bias=False)
        self.dt_proj = nn.Linear(self.rank, inner)
        dt = torch.exp(torch.rand(inner) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt), as in Mamba
        self.A_log = nn.Parameter(torch.log(torch.arange(1, state + 1, dtype=torch.float32)).repeat(inner, 1))
        self.D = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, hidden)

    def selection(self, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Δ (…, E), B (…, N), C (…, N) from the conv output c (…, E)."""
        raw, B, C = self.x_proj(c).split([self.rank, self.state, self.state], dim=-1)
        return F.softplus(self.dt_proj(raw)), B, C

    def forward(self, u: Tensor) -> Tensor:
        """Training path. u (Bt, T, H) → (Bt, T, H): the whole sequence's projections at once, then
        the diagonal recurrence step by step."""
        T = u.shape[1]
        a, g = self.in_proj(self.norm(u)).chunk(2, dim=-1)
        c = F.silu(self.conv(a.transpose(1, 2))[..., :T].transpose(1, 2))  # (Bt, T, E)
        dt, B, C = self.selection(c)
        dA = torch.exp(dt[..., None] * -torch.exp(self.A_log))  # (Bt, T, E, N)
        dBc = (dt * c)[..., None] * B[:, :, None, :]
        s = u.new_zeros(u.shape[0], self.inner, self.state)
        ys = []
        for a_t, b_t, c_t in zip(dA.unbind(1), dBc.unbind(1), C.unbind(1)):  # unbind: one backward
            s = a_t * s + b_t  # (indexing [:, t] would zero-fill a whole (Bt, T, E, N) gradient per step)
            ys.append((s * c_t[:, None, :]).sum(-1))
        y = (torch.stack(ys, dim=1) + self.D * c) * F.silu(g)
        return u + self.out_proj(y)

    def window(self, u: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        """The new window (Bt, E, K) from the old one and this step's residual input u (Bt, H), and g."""
        a, g = self.in_proj(self.norm(u)).chunk(2, dim=-1)
        return torch.cat([w[..., 1:], a[..., None]], dim=-1), g

    def conv_out(self, w: Tensor) -> Tensor:
        return F.silu((w * self.conv.weight[:, 0, :]).sum(-1) + self.conv.bias)

    def step(self, u: Tensor, w: Tensor, s: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One step: (u_out (Bt, H), new window (Bt, E, K), new SSM state (Bt, E, N), exp(Δ A) (Bt, E, N))."""
        w, g = self.window(u, w)
        c = self.conv_out(w)
        dt, B, C = self.selection(c)
        dA = torch.exp(dt[..., None] * -torch.exp(self.A_log))
        s = dA * s + (dt * c)[..., None] * B[:, None, :]
        return self.output(u, w, s, g, c, C), w, s, dA

    def output(self, u: Tensor, w: Tensor, s: Tensor, g: Tensor | None = None, c: Tensor | None = None,
               C: Tensor | None = None) -> Tensor:
        """u + out_proj(y) from the state after the step (window w, SSM state s)."""
        if g is None:
            g = self.in_proj(self.norm(u)).chunk(2, dim=-1)[1]
        if c is None:
            c = self.conv_out(w)
        if C is None:
            C = self.selection(c)[2]
        y = ((s * C[:, None, :]).sum(-1) + self.D * c) * F.silu(g)
        return u + self.out_proj(y)


class MambaCore(Core):
    """``Linear(in, H)`` → ``num_layers`` selective-SSM layers on a residual stream."""

    name: ClassVar[str] = "mamba"
    label: ClassVar[str] = "Mamba"
    Config: ClassVar[type] = MambaConfig
    tiny_config: ClassVar[dict[str, Any]] = {"state_size": 3, "expand": 2, "conv_width": 3, "dt_min": 0.05,
                                             "dt_max": 0.5}

    def __init__(self, input_size: int, hidden_size: int, num_layers: int, config: MambaConfig) -> None:
        super().__init__()
        self.hidden_size, self.inner = hidden_size, config.expand * hidden_size
        self.N, self.K = config.state_size, config.conv_width
        self.in_proj = nn.Linear(input_size, hidden_size)
        self.layers = nn.ModuleList(MambaLayer(hidden_size, self.inner, self.N, self.K, config.dt_min, config.dt_max)
                                    for _ in range(num_layers))

    @classmethod
    def token_floats(cls, hidden_size: int, config: MambaConfig) -> int:
        """The scan keeps exp(ΔA), ΔB·c and the state before and after each step: 4 × E × N per token."""
        return 4 * config.expand * hidden_size * config.state_size

    @classmethod
    def check_steps(cls, config: MambaConfig, steps: int) -> None:
        check(config.conv_width <= steps, f"conv_width: got {config.conv_width}; the task's sequences are {steps} "
                                          f"steps long, and a causal convolution wider than that sees nothing more "
                                          f"(give at most {steps})")

    @classmethod
    def build(cls, input_size: int, hidden_size: int, num_layers: int, config: MambaConfig) -> "MambaCore":
        return cls(input_size, hidden_size, num_layers, config)

    @property
    def layer_state(self) -> int:
        return self.inner * (self.K + self.N)

    @property
    def state_dim(self) -> int:  # type: ignore[override]
        return self.layer_state * len(self.layers)

    @property
    def out_dim(self) -> int:  # type: ignore[override]
        return self.hidden_size

    def state_layout(self) -> dict[str, slice]:
        out, P, W = {}, self.layer_state, self.inner * self.K
        for layer in range(len(self.layers)):
            out[f"l{layer + 1}/conv"] = slice(layer * P, layer * P + W)  # its oldest entry is never read
            out[f"l{layer + 1}/ssm"] = slice(layer * P + W, (layer + 1) * P)
        return out

    def _split(self, z: Tensor) -> list[tuple[Tensor, Tensor]]:
        W, Bt = self.inner * self.K, z.shape[0]
        return [(part[:, :W].reshape(Bt, self.inner, self.K), part[:, W:].reshape(Bt, self.inner, self.N))
                for part in z.split(self.layer_state, dim=-1)]

    def forward(self, x: Tensor) -> Tensor:
        u = self.in_proj(x)
        for layer in self.layers:
            u = layer(u)
        return u

    def _step(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor, list[Tensor]]:
        u, new, decay = self.in_proj(x), [], []
        for layer, (w, s) in zip(self.layers, self._split(z)):
            u, w, s, dA = layer.step(u, w, s)
            new += [w.flatten(1), s.flatten(1)]
            decay.append(dA)
        return u, torch.cat(new, dim=-1), decay

    def step(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, in), z (B, D) → (residual stream after the top layer (B, H), z' (B, D))."""
        u, z, _ = self._step(x, z)
        return u, z

    def readout(self, x: Tensor, z: Tensor) -> Tensor:
        """The output from the state right after the step (each window holds that step's input)."""
        u = self.in_proj(x)
        for layer, (w, s) in zip(self.layers, self._split(z)):
            u = layer.output(u, w, s)
        return u

    def jacobian_structure(self) -> JacobianStructure:
        blocks, P, W = [], self.layer_state, self.inner * self.K
        for layer in range(len(self.layers)):
            blocks.append(StateBlock(f"l{layer + 1}/conv", layer * P, layer * P + W, "block_diagonal", self.K))
            blocks.append(StateBlock(f"l{layer + 1}/ssm", layer * P + W, (layer + 1) * P, "diagonal"))
        return JacobianStructure(tuple(blocks))

    def diagonal_blocks(self, x: Tensor, z: Tensor) -> list[Tensor]:
        """Per layer: the window's shift, one K × K block per inner channel (B, E, K, K); the SSM state's
        exp(Δ A) (B, E·N)."""
        shift = torch.diag(z.new_ones(self.K - 1), 1).expand(z.shape[0], self.inner, self.K, self.K)
        out = []
        for dA in self._step(x, z)[2]:
            out += [shift, dA.flatten(1)]
        return out
