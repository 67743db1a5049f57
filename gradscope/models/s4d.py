"""Diagonal state-space core (S4D, docs/definitions.md §2), as in the state-spaces reference ``s4d.py``.

Per channel h and mode n (N/2 complex modes): A_n = −exp(log_A_real) + i·A_imag (init −0.5 + iπn),
dt = exp(log_dt), dA = exp(dt·A), dB = (exp(dt·A) − 1)/A, B = 1.
Recurrence x_t = dA ⊙ x_{t−1} + dB·u_t, y_t = 2·Re(Σ_n C_n x_{t,n}) + D·u_t → GELU →
Conv1d(H, 2H, 1) → GLU. Training uses the equivalent FFT convolution with kernel
K_l = 2·Re(Σ_n C_n dB_n dA_n^l); analysis uses :meth:`S4DCore.step` on a real view of the state.
State-dict names follow the paper's code: ``in_proj``, ``ssm.<l>.D``, ``ssm.<l>.kernel.{C,
log_dt, log_A_real, A_imag}``, ``ssm.<l>.output_linear.0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.fields import DT_MAX, DT_MIN, check_fields, option
from gradscope.models.core import Core, scaled_rows
from gradscope.models.structure import JacobianStructure, StateBlock


@dataclass(frozen=True, kw_only=True)
class S4DConfig:
    """S4D's own settings: state size N (N/2 complex modes per channel) and the range of the
    initial step sizes dt."""

    state_size: int = option(64, "State size N (N/2 complex modes per channel).", short="N", alias="state", low=2)
    dt_min: float = DT_MIN
    dt_max: float = DT_MAX

    def __post_init__(self) -> None:
        check_fields(self)  # the range declared on the field
        check(self.state_size % 2 == 0,
              f"state_size: got {self.state_size}; S4D needs a positive even state size (N/2 complex modes)")
        check(0 < self.dt_min <= self.dt_max, f"dt_min/dt_max: got {self.dt_min}/{self.dt_max}; need 0 < dt_min <= dt_max")


class S4DKernel(nn.Module):
    """Parameters of the diagonal SSM of one block: H channels × N/2 complex modes."""

    def __init__(self, channels: int, state_size: int, dt_min: float, dt_max: float) -> None:
        super().__init__()
        modes = state_size // 2
        log_dt = torch.rand(channels) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)
        self.log_dt = nn.Parameter(log_dt)  # (H,)
        self.C = nn.Parameter(torch.view_as_real(torch.randn(channels, modes, dtype=torch.cfloat)))  # (H, N/2, 2)
        self.log_A_real = nn.Parameter(torch.log(0.5 * torch.ones(channels, modes)))  # (H, N/2)
        self.A_imag = nn.Parameter(math.pi * torch.arange(modes, dtype=torch.float32).repeat(channels, 1))

    def _dt_A(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(dt·A, A), complex (H, N/2), with A = −exp(log_A_real) + i·A_imag."""
        A = torch.complex(-torch.exp(self.log_A_real), self.A_imag)
        return A * torch.exp(self.log_dt)[:, None], A

    def discrete(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dA, dB, C), each complex (H, N/2)."""
        dtA, A = self._dt_A()
        dA = torch.exp(dtA)
        return dA, (dA - 1.0) / A, torch.complex(self.C[..., 0], self.C[..., 1])

    def forward(self, length: int) -> torch.Tensor:
        """Convolution kernel K (H, L): K_l = 2·Re(Σ_n C_n dB_n dA_n^l)."""
        dtA, _ = self._dt_A()
        _, dB, C = self.discrete()
        powers = torch.exp(dtA[..., None] * torch.arange(length, device=dtA.device))  # (H, N/2, L)
        return 2 * torch.einsum("hn,hnl->hl", C * dB, powers).real


class S4DBlock(nn.Module):
    """One S4D layer: SSM convolution + D skip → GELU → position-wise Conv1d(H, 2H, 1) + GLU."""

    def __init__(self, channels: int, state_size: int, dt_min: float, dt_max: float) -> None:
        super().__init__()
        self.D = nn.Parameter(torch.randn(channels))
        self.kernel = S4DKernel(channels, state_size, dt_min, dt_max)
        self.output_linear = nn.Sequential(nn.Conv1d(channels, 2 * channels, kernel_size=1), nn.GLU(dim=-2))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """FFT path. u (B, H, L) → (B, H, L)."""
        length = u.shape[-1]
        k = self.kernel(length)  # (H, L)
        y = torch.fft.irfft(torch.fft.rfft(u, n=2 * length) * torch.fft.rfft(k, n=2 * length), n=2 * length)
        y = y[..., :length] + u * self.D[:, None]  # (B, H, L)
        return self.output_linear(nn.functional.gelu(y))

    def readout(self, y: torch.Tensor) -> torch.Tensor:
        """Position-wise tail for one step: y (B, H) (before GELU) → (B, H)."""
        conv = self.output_linear[0]
        v = nn.functional.gelu(y) @ conv.weight[:, :, 0].T + conv.bias  # (B, 2H)
        a, b = v.chunk(2, dim=-1)
        return a * torch.sigmoid(b)

    def readout_jacobian(self, y: Tensor) -> Tensor:
        """∂ readout(y)/∂y for GELU → Conv1d(H, 2H, 1) → GLU at pre-GELU values y (B, H) → (B, H, H)."""
        conv = self.output_linear[0]
        w = conv.weight[:, :, 0]  # (2H, H)
        cdf = 0.5 * (1 + torch.erf(y / math.sqrt(2)))
        gelu, dgelu = y * cdf, cdf + y * torch.exp(-0.5 * y * y) / math.sqrt(2 * math.pi)  # exact GELU
        a, b = (gelu @ w.T + conv.bias).chunk(2, dim=-1)
        sig = torch.sigmoid(b)
        return scaled_rows(torch.stack([sig, a * sig * (1 - sig)], dim=1), w) * dgelu[:, None, :]

    def output(self, u: Tensor, state: Tensor) -> Tensor:
        """y = 2·Re(Σ_n C_n x_n) + D·u before the tail: u (B, H), complex state (B, H, N/2) → (B, H)."""
        _, _, C = self.kernel.discrete()
        return 2 * (C * state).real.sum(-1) + self.D * u


class S4DCore(Core):
    """Linear(in, H) → ``num_layers`` S4D blocks (no residual or norm between them). The state is
    every block's complex state (B, H, N/2) on the real view, block 1 first."""

    name: ClassVar[str] = "s4d"
    label: ClassVar[str] = "S4D"
    complex_state: ClassVar[bool] = True
    gate_names: ClassVar[tuple[str, ...]] = ("transition",)
    Config: ClassVar[type] = S4DConfig
    tiny_config: ClassVar[dict[str, Any]] = {"state_size": 4, "dt_min": 0.05, "dt_max": 0.5}

    @classmethod
    def build(cls, input_size: int, hidden_size: int, num_layers: int, config: S4DConfig) -> "S4DCore":
        return cls(input_size, hidden_size, num_layers, config.state_size, config.dt_min, config.dt_max)

    def __init__(self, input_size: int, channels: int, num_layers: int, state_size: int,
                 dt_min: float, dt_max: float) -> None:
        super().__init__()
        self.channels = channels
        self.modes = state_size // 2
        self.in_proj = nn.Linear(input_size, channels)
        self.ssm = nn.ModuleList(S4DBlock(channels, state_size, dt_min, dt_max) for _ in range(num_layers))

    @property
    def block_state(self) -> int:
        return 2 * self.channels * self.modes

    @property
    def state_dim(self) -> int:
        """D = blocks × 2·H·N/2: every block's complex state as real numbers (view_as_real layout)."""
        return self.block_state * len(self.ssm)

    @property
    def out_dim(self) -> int:
        return self.channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """FFT path. x (B, T, in) → (B, T, H)."""
        u = self.in_proj(x).transpose(1, 2)  # (B, H, T)
        for block in self.ssm:
            u = block(u)
        return u.transpose(1, 2)


    def state_layout(self) -> dict[str, slice]:
        return {f"modes{b + 1}": slice(b * self.block_state, (b + 1) * self.block_state) for b in range(len(self.ssm))}

    def _complex(self, part: Tensor) -> Tensor:
        pair = part.reshape(-1, self.channels, self.modes, 2)
        return torch.complex(pair[..., 0], pair[..., 1])  # (B, H, N/2)

    def step(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        """Functional step on the real view. x (B, in), z (B, D) → (output (B, H), z' (B, D))."""
        u = x @ self.in_proj.weight.T + self.in_proj.bias  # (B, H)
        new = []
        for block, part in zip(self.ssm, z.split(self.block_state, dim=-1)):
            dA, dB, _ = block.kernel.discrete()  # (H, N/2) each
            state = dA * self._complex(part) + dB * u[..., None]  # (B, H, N/2)
            u = block.readout(block.output(u, state))
            new.append(torch.stack([state.real, state.imag], dim=-1).reshape(part.shape))
        return u, torch.cat(new, dim=-1)

    def readout(self, x: Tensor, z: Tensor) -> Tensor:
        """Every block's output from its state after the step. x (B, in), z (B, D) → (B, H)."""
        u = x @ self.in_proj.weight.T + self.in_proj.bias  # (B, H)
        for block, part in zip(self.ssm, z.split(self.block_state, dim=-1)):
            u = block.readout(block.output(u, self._complex(part)))
        return u

    def step_jacobian(self, x: Tensor, z: Tensor) -> Tensor:
        """J_t = ∂z_t/∂z_{t−1} on the real view: x (B, in), z (B, D) → (B, D, D). Block l's own block is
        its diagonal transition, a 2 × 2 rotation-scaling [[a, −b], [b, a]] per mode (dA = a + ib),
        the same for every input. Block l+1 reads block l's output u_{l+1} = readout(y_l), which sees
        the states through y_l = 2·Re(Σ_n C_n x'_n) + D·u_l, so below the diagonal
        ∂x'_{l+1}/∂z_m = dB_{l+1} ⊗ ∂u_{l+1}/∂z_m (dB real view per mode, u per channel), with
        ∂u_{l+1}/∂z_l = R_l · [2 Re(C dA), −2 Im(C dA)] and, for m < l,
        ∂u_{l+1}/∂z_m = R_l · diag(D + 2 Re Σ_n C_n dB_n) · ∂u_l/∂z_m (R_l the readout Jacobian).
        A replaced block readout falls back to the generic ``torch.func`` form."""
        if any("readout" in vars(block) for block in self.ssm):
            return super().step_jacobian(x, z)
        B, H, M, P = z.shape[0], self.channels, self.channels * self.modes, self.block_state
        J = z.new_zeros(B, self.state_dim, self.state_dim)
        u = x @ self.in_proj.weight.T + self.in_proj.bias  # (B, H)
        du = None  # ∂u/∂z (B, H, l·P) of the input u of block l; block 1 reads in_proj(x): no state
        for layer, (block, part) in enumerate(zip(self.ssm, z.split(P, dim=-1))):
            dA, dB, C = block.kernel.discrete()  # (H, N/2) complex each
            cols = slice(layer * P, (layer + 1) * P)
            rot = torch.stack([torch.stack([dA.real, -dA.imag], dim=-1),
                               torch.stack([dA.imag, dA.real], dim=-1)], dim=-2)  # (H, N/2, 2, 2)
            # the M = H·N/2 diagonal 2 × 2 blocks of this block's (P, P) square, as one strided view
            J[:, cols, cols].view(B, M, 2, M, 2).diagonal(dim1=1, dim2=3).copy_(rot.reshape(M, 2, 2).permute(1, 2, 0))
            if du is not None:  # x' = dA x + dB u: u_h reaches every mode of channel h
                dB_real = torch.view_as_real(dB).reshape(1, H, -1, 1)  # (1, H, N, 1): rows (h, n, re/im)
                J[:, cols, :layer * P] = (dB_real * du[:, :, None, :]).reshape(B, P, -1)
            state = dA * self._complex(part) + dB * u[..., None]  # (B, H, N/2)
            y = block.output(u, state)  # (B, H), before the GELU
            if layer + 1 < len(self.ssm):
                R = block.readout_jacobian(y)  # (B, H, H)
                gain = torch.view_as_real(C * dA) * torch.tensor([2.0, -2.0], dtype=z.dtype, device=z.device)
                du_next = z.new_empty(B, H, (layer + 1) * P)
                du_next[:, :, cols] = (R[..., None] * gain.reshape(1, 1, H, -1)).reshape(B, H, P)
                if du is not None:
                    skip = block.D + 2 * (C * dB).real.sum(-1)  # (H,): ∂y/∂u through D·u and dB·u
                    du_next[:, :, :layer * P] = R @ (skip[:, None] * du)
                du = du_next
            u = block.readout(y)
        return J

    def jacobian_structure(self) -> JacobianStructure:
        """Each block's transition is complex diagonal (dA per mode, 2 × 2 rotation-scalings on the real
        view); block l+1 reads block l's output at the same step: lower-triangular across blocks."""
        P = self.block_state
        return JacobianStructure(tuple(StateBlock(f"modes{b + 1}", b * P, (b + 1) * P, "complex_diagonal")
                                       for b in range(len(self.ssm))))

    def diagonal_blocks(self, x: Tensor, z: Tensor) -> list[Tensor]:
        """dA of every block, (B, H·N/2) complex each (mode order h·N/2 + n, as on the real view); the
        same for every input and state."""
        return [block.kernel.discrete()[0].reshape(1, -1).expand(z.shape[0], -1) for block in self.ssm]

    def gate_terms(self, x: Tensor, z: Tensor) -> dict[str, Tensor]:
        """One term: ``transition`` owns all of J_t (the diagonal transitions and the cross-block reads)."""
        return {"transition": self.step_jacobian(x, z)}

    def analytic_unsupported(self) -> str | None:
        if len(self.ssm) != 1:
            return f"it covers single-block S4D only (this core has {len(self.ssm)} blocks)"
        if "readout" in vars(self.ssm[0]):
            return "the S4D block's readout has been replaced"
        return None

    def analytic_jacobian(self, x: Tensor, zs: Tensor, p: int) -> Tensor:
        """Closed form for one block: ∂x_T/∂x_p = dA^(T−p) is diagonal (a 2 × 2 rotation-scaling per
        mode on the real view), so J[i, (h, n, re/im)] = R_T[i, h] · (2a, −2b) with
        a + ib = C_hn dA_hn^(T−p), and R_T holds the D-skip, GELU' and GLU. → (B, H, D)."""
        B, T, _ = x.shape
        block = self.ssm[0]
        dA, _, C = block.kernel.discrete()  # (H, N/2) complex
        u = x[:, T - 1] @ self.in_proj.weight.T + self.in_proj.bias  # (B, H)
        y = block.output(u, self._complex(zs[:, T - 1]))  # (B, H), D-skip included
        k = C * dA ** (T - p)
        gain = torch.stack([2 * k.real, -2 * k.imag], dim=-1)  # (H, N/2, 2): view_as_real layout
        return (block.readout_jacobian(y)[..., None, None] * gain).reshape(B, self.out_dim, -1)
