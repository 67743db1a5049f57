"""The S4D core: its FFT convolution equals its recurrence, its kernel equals the definition (SPEC §2), and
its step Jacobian is one rotation-scaling block per mode (SPEC §7)."""

from __future__ import annotations

import math

import pytest
import torch

from gradscope.models.s4d import S4DCore

from tests.models.test_core import B, TOL, _core, _err, _point


def test_s4d_single_block_is_rotation_scaling_per_mode() -> None:
    """One block: J = ⊕ |dA|·[[cos θ, −sin θ], [sin θ, cos θ]] with |dA| = exp(−exp(log_dt + log_A_real))
    and θ = exp(log_dt)·A_imag (SPEC §7), whatever the input or state."""
    core = _core("s4d", 1)
    x, z = _point(core)
    kern = core.ssm[0].kernel
    dt = torch.exp(kern.log_dt)[:, None]
    mag, theta = torch.exp(-dt * torch.exp(kern.log_A_real)), dt * kern.A_imag  # (H, N/2)
    blocks = [torch.tensor([[m * math.cos(t), -m * math.sin(t)], [m * math.sin(t), m * math.cos(t)]],
                           dtype=torch.float64) for m, t in zip(mag.flatten().tolist(), theta.flatten().tolist())]
    expected = torch.block_diag(*blocks).expand(B, -1, -1)
    assert _err(core.gate_terms(x, z)["transition"] - expected) <= TOL
    assert _err(core.step_jacobian(x * 7, z * -3) - expected) <= TOL


@pytest.mark.parametrize("blocks", [1, 2])
def test_s4d_fft_convolution_matches_recurrence(blocks: int) -> None:
    torch.manual_seed(3)
    core = S4DCore(input_size=5, channels=6, num_layers=blocks, state_size=8, dt_min=1e-3, dt_max=1e-1)
    with torch.no_grad():  # make the dynamics non-trivial: slower decay, larger steps
        for block in core.ssm:
            block.kernel.log_dt.fill_(math.log(0.3))
    x = torch.randn(4, 50, 5)
    with torch.no_grad():
        fft = core(x)
        rec, _ = core.scan(x)
    assert torch.allclose(fft, rec, atol=1e-5, rtol=0)


def test_s4d_kernel_matches_definition() -> None:
    """K_l = 2·Re(Σ_n C_n dB_n dA_n^l), evaluated independently in complex128."""
    torch.manual_seed(4)
    core = S4DCore(3, 4, 1, 6, 1e-3, 1e-1).double()
    kernel = core.ssm[0].kernel
    dt = torch.exp(kernel.log_dt)
    A = -torch.exp(kernel.log_A_real) + 1j * kernel.A_imag
    C = torch.view_as_complex(kernel.C.contiguous())
    dA = torch.exp(dt[:, None] * A)
    dB = (dA - 1) / A
    expected = torch.stack([2 * (C * dB * dA ** l).sum(-1).real for l in range(7)], dim=-1)
    assert torch.allclose(kernel(7), expected, atol=1e-12)
    # initialisation of SPEC §2: A_n = −0.5 + iπn, log_dt in [log 1e-3, log 1e-1]
    assert torch.allclose(A, (-0.5 + 1j * math.pi * torch.arange(3)).expand(4, 3).to(A.dtype))
    assert bool(((dt >= 1e-3 - 1e-12) & (dt <= 1e-1 + 1e-12)).all())
