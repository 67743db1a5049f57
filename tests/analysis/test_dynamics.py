"""Gradient dynamics (SPEC §7) against closed forms and float64 brute force: Lyapunov exponents of a
linear RNN (log|eig W|) and of single-block S4D (log|dA|), a per-step autograd + QR loop through the
fused nn.GRU / nn.LSTM, Σλ = mean log|det J_t|, re-orthonormalisation blocks; gradient flow against
state_jacobian; the (t, T) grid and the step spectra against autograd Jacobians of rolled steps."""

from __future__ import annotations

import functools
import math

import pytest

from tests.helpers.cores import tiny_model
import torch
from torch import Tensor, nn

import gradscope
from gradscope.analysis.dynamics import gradient_flow, step_spectra, tT_grid, trajectory_tokens
from gradscope.analysis.lyapunov import lyapunov_spectrum
from gradscope.analysis.jacobian import state_jacobian
from gradscope.errors import GradscopeError
from gradscope.models import S4DCore
from gradscope.models.seq import SeqModel

F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------
# Lyapunov spectrum

class LinearCore(nn.Module):
    """z_t = W z_{t−1} + U x_t, y_t = z_t: a protocol core without a step_jacobian (the generic path)."""

    def __init__(self, W: Tensor, U: Tensor) -> None:
        super().__init__()
        self.W, self.U = nn.Parameter(W), nn.Parameter(U)
        self.state_dim = self.out_dim = W.shape[0]

    def step(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        z = z @ self.W.T + x @ self.U.T
        return z, z

    def readout(self, x: Tensor, z: Tensor) -> Tensor:
        return z


def rotation(r: float, theta: float) -> Tensor:
    return r * torch.tensor([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]], dtype=F64)


def test_linear_rnn_exponents_are_log_moduli_of_the_eigenvalues() -> None:
    blocks = [rotation(0.9, 0.3), rotation(1.05, 1.1), rotation(0.5, 2.0), torch.tensor([[-0.7]], dtype=F64),
              torch.tensor([[0.3]], dtype=F64)]
    Q, _ = torch.linalg.qr(torch.randn(8, 8, generator=gen(0), dtype=F64))
    W = Q @ torch.block_diag(*blocks) @ Q.T
    core = LinearCore(W, torch.randn(8, 3, generator=gen(1), dtype=F64))
    x = torch.randn(2, 2000, 3, generator=gen(2), dtype=F64)
    res = lyapunov_spectrum(core, x, warmup=100)
    expected = torch.linalg.eigvals(W).abs().log().sort(descending=True).values  # independent of the blocks
    assert torch.allclose(expected, torch.tensor([math.log(1.05)] * 2 + [math.log(0.9)] * 2 + [math.log(0.7)]
                                                 + [math.log(0.5)] * 2 + [math.log(0.3)], dtype=F64), atol=1e-12)
    assert res.exponents.shape == (2, 8) and res.exponents.dtype == F64
    assert (res.exponents - expected).abs().max() < 1e-4
    assert res.running.shape == (2, len(res.running_steps), 8) and int(res.running_steps[-1]) == 1900
    # bit for bit: a copy of the same tensor
    assert torch.equal(res.running[:, -1], res.exponents)
    assert (res.running_steps.diff() == 10).all()


def test_single_block_s4d_exponents_are_log_moduli_of_dA_twice() -> None:
    torch.manual_seed(0)
    core = S4DCore(3, 4, 1, 6, 0.01, 0.5).double()
    with torch.no_grad():  # distinct real parts, so every pair is its own exponent
        core.ssm[0].kernel.log_A_real.copy_(torch.randn(4, 3, generator=gen(1), dtype=F64))
    kernel = core.ssm[0].kernel
    expected = (-torch.exp(kernel.log_dt[:, None] + kernel.log_A_real)).detach()  # (H, N/2)
    expected = expected.reshape(-1).repeat_interleave(2).sort(descending=True).values  # real view: twice
    res = lyapunov_spectrum(core, torch.randn(3, 300, 3, generator=gen(2), dtype=F64), warmup=20)
    assert res.exponents.shape == (3, 24)
    assert (res.exponents - expected).abs().max() < 1e-4


def fused_step(rnn: nn.RNNBase, x: Tensor, z: Tensor) -> Tensor:
    """The fused module's own step on one trajectory: x (in,), z (D,) → (D,); LSTM z = [h, c]."""
    if isinstance(rnn, nn.LSTM):
        H = rnn.hidden_size
        _, (h, c) = rnn(x[None, None], (z[None, None, :H], z[None, None, H:]))
        return torch.cat([h[0, 0], c[0, 0]])
    return rnn(x[None, None], z[None, None])[1][0, 0]


def brute_force(rnn: nn.RNNBase, x: Tensor, warmup: int) -> tuple[Tensor, Tensor]:
    """Per trajectory and step: autograd.functional.jacobian of the fused step, J @ Q, linalg.qr, all in
    float64. → (exponents sorted descending (B, D), mean log|det J_t| over the counted steps (B,))."""
    D = rnn.hidden_size * (2 if isinstance(rnn, nn.LSTM) else 1)
    exps, dets = [], []
    for s in range(x.shape[0]):
        z, Q = x.new_zeros(D), torch.eye(D, dtype=F64)
        logs, log_det = torch.zeros(D, dtype=F64), 0.0
        for t in range(x.shape[1]):
            J = torch.autograd.functional.jacobian(lambda v: fused_step(rnn, x[s, t], v), z)  # noqa: B023
            Q, R = torch.linalg.qr(J @ Q)
            if t >= warmup:
                logs += R.diagonal().abs().log()
                log_det += float(torch.linalg.slogdet(J).logabsdet)
            with torch.no_grad():
                z = fused_step(rnn, x[s, t], z)
        exps.append(logs / (x.shape[1] - warmup))
        dets.append(log_det / (x.shape[1] - warmup))
    return torch.stack(exps).sort(dim=-1, descending=True).values, torch.tensor(dets, dtype=F64)


def wrapped(kind: type[nn.RNNBase], seed: int = 0, scale: float = 2.0) -> gradscope.models.wrap.WrappedModel:
    torch.manual_seed(seed)
    rnn = kind(3, 4, batch_first=True).double()
    with torch.no_grad():
        rnn.weight_hh_l0.mul_(scale)  # a wide, contracting spectrum: trajectories of both codes stay together
    return gradscope.wrap(rnn)


@functools.cache
def fused_case(kind: type[nn.RNNBase]) -> tuple[Tensor, Tensor, object]:
    """(brute-force exponents, its mean log|det J_t|, gradscope's result) on 2 trajectories × 150 steps."""
    model = wrapped(kind)
    x = torch.randn(2, 150, 3, generator=gen(3), dtype=F64)
    expected, mean_log_det = brute_force(model.core.rnn, x, warmup=30)
    return expected, mean_log_det, lyapunov_spectrum(model.core, x, warmup=30, sum_check=True)


@pytest.mark.parametrize("kind", [nn.GRU, nn.LSTM])
def test_exponents_match_float64_per_step_autograd_through_the_fused_module(kind: type[nn.RNNBase]) -> None:
    expected, _, res = fused_case(kind)
    assert expected[:, 0].max() < 0  # contracting, as intended
    assert (res.exponents - expected).abs().max() < 1e-8  # the issue asks 1e-3; the algorithm is the same


@pytest.mark.parametrize("kind", [nn.GRU, nn.LSTM])
def test_sum_of_exponents_is_the_mean_log_determinant(kind: type[nn.RNNBase]) -> None:
    _, mean_log_det, res = fused_case(kind)  # determinants of the brute force's own Jacobians
    assert (res.exponents.sum(-1) - mean_log_det).abs().max() < 1e-8
    assert (res.log_det_mean - mean_log_det).abs().max() < 1e-8


def gru(seed: int = 0, layers: int = 1, scale: float = 3.0, core: str = "gru") -> SeqModel:
    """A float64 tiny model of ``core`` (tests/helpers/cores.py), recurrent weights scaled by ``scale``."""
    return tiny_model(core, 6, 4, 5, layers, seed=seed, gain=scale)


@pytest.mark.parametrize("warmup,reorth", [(20, 5), (13, 7), (0, 4)])
def test_reorthonormalising_every_k_steps_gives_the_same_exponents(warmup: int, reorth: int) -> None:
    model = gru(scale=1.5)  # contracting, spectrum ~[-2, -0.3]: a block of 7 steps loses nothing in float64
    x = model.core_inputs(trajectory_tokens(6, 200, 3, seed=4))
    one = lyapunov_spectrum(model.core, x, warmup=warmup)
    block = lyapunov_spectrum(model.core, x, warmup=warmup, reorth=reorth, checkpoint_every=reorth)
    assert one.exponents[:, 0].max() < 0
    assert (one.exponents - block.exponents).abs().max() < 1e-9
    assert int(block.running_steps[-1]) == 200 - warmup
    assert (block.running_steps[:-1] % reorth == 0).all()


def test_lyapunov_rejects_bad_arguments() -> None:
    model = gru()
    x = model.core_inputs(trajectory_tokens(6, 10, 2, seed=0))
    for kwargs, name in [({"warmup": 10}, "warmup"), ({"warmup": -1}, "warmup"),
                         ({"warmup": 2, "reorth": 0}, "reorth"),
                         ({"warmup": 2, "z0": torch.zeros(3, 5, dtype=F64)}, "z0")]:
        with pytest.raises(GradscopeError, match=name):
            lyapunov_spectrum(model.core, x, **kwargs)


def test_trajectory_tokens_are_seeded_and_follow_the_distribution() -> None:
    a = trajectory_tokens(64, 500, 8, seed=3)
    assert a.shape == (8, 500) and a.dtype == torch.int64
    assert torch.equal(a, trajectory_tokens(64, 500, 8, seed=3))
    assert not torch.equal(a, trajectory_tokens(64, 500, 8, seed=4))
    assert abs((a >= 32).double().mean().item() - 0.125) < 0.02  # Rare = upper half, rarity 1/8
    u = trajectory_tokens(64, 500, 8, seed=3, distribution="uniform")
    assert abs((u >= 32).double().mean().item() - 0.5) < 0.03
    with pytest.raises(GradscopeError, match="distribution"):
        trajectory_tokens(64, 5, 2, seed=0, distribution="zipf")


# ---------------------------------------------------------------------------------------------
# Gradient flow, (t, T) grid, step spectra

def tokens(seed: int = 1, B: int = 3, T: int = 8) -> Tensor:
    return torch.randint(0, 7, (B, T), generator=gen(seed))


@pytest.mark.parametrize("core,layers", [("gru", 1), ("lstm", 1), ("elman", 2), ("s4d", 1)])
@pytest.mark.parametrize("method", ["jacobian", "vjp"])
def test_gradient_flow_is_the_norm_of_state_jacobian_at_every_step(core: str, layers: int, method: str) -> None:
    model, toks = gru(core=core, layers=layers), tokens()
    fro, spectral = gradient_flow(model, toks, method=method)
    assert fro.shape == spectral.shape == (3, 8)
    for p in (1, 2, 5, 7, 8):
        jac = state_jacobian(model, toks, p).jac
        scale = float(torch.linalg.matrix_norm(jac).max())
        assert scale > 1e-3  # not comparing zeros
        assert (fro[:, p - 1] - torch.linalg.matrix_norm(jac)).abs().max() < 1e-10 * max(1.0, scale)
        assert (spectral[:, p - 1] - torch.linalg.matrix_norm(jac, ord=2)).abs().max() < 1e-10 * max(1.0, scale)
    # T cuts the tokens: the flow to step 5 is the flow of the first 5 tokens
    fro5, _ = gradient_flow(model, toks, T=5, method=method)
    assert torch.allclose(fro5, gradient_flow(model, toks[:, :5], method=method)[0], atol=0, rtol=0)


class NoReadout(nn.Module):
    """A tanh RNN protocol core without ``readout``: the flow at k = T is undefined (NaN)."""

    def __init__(self) -> None:
        super().__init__()
        self.W = nn.Parameter(1.5 * torch.randn(4, 4, generator=gen(5), dtype=F64))
        self.U = nn.Parameter(torch.randn(4, 3, generator=gen(6), dtype=F64))
        self.state_dim = self.out_dim = 4

    def step(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        z = torch.tanh(z @ self.W.T + x @ self.U.T)
        return z, z


@pytest.mark.parametrize("method", ["jacobian", "vjp"])
def test_gradient_flow_without_a_readout_starts_one_step_earlier(method: str) -> None:
    model = gradscope.wrap(NoReadout())
    x = torch.randn(2, 6, 3, generator=gen(7), dtype=F64)
    fro, spectral = gradient_flow(model, x, method=method)
    assert torch.isnan(fro[:, -1]).all() and torch.isnan(spectral[:, -1]).all()
    for p in (1, 3, 5):
        jac = state_jacobian(model, x, p).jac
        assert (fro[:, p - 1] - torch.linalg.matrix_norm(jac)).abs().max() < 1e-12
        assert (spectral[:, p - 1] - torch.linalg.matrix_norm(jac, ord=2)).abs().max() < 1e-12


def rolled_jacobian(model: SeqModel, toks: Tensor, t: int, T: int) -> Tensor:
    """∂z_T/∂z_t by autograd through core.step rolled from z_t (one sequence per row). → (B, D, D)."""
    with torch.no_grad():
        x = model.core_inputs(toks)
        _, zs = model.core.scan(x)

    def roll(z: Tensor, b: int) -> Tensor:
        z = z[None]
        for s in range(t, T):
            z = model.core.step(x[b:b + 1, s], z)[1]
        return z[0]
    return torch.stack([torch.autograd.functional.jacobian(lambda z: roll(z, b), zs[b, t - 1])  # noqa: B023
                        for b in range(toks.shape[0])])


@pytest.mark.parametrize("core", ["gru", "lstm"])
def test_tT_grid_against_rolled_autograd_products(core: str) -> None:
    model, toks = gru(core=core), tokens(T=7)
    grid = tT_grid(model, toks)
    D = model.core.state_dim
    assert grid.shape == (3, 7, 7)
    assert torch.allclose(grid.diagonal(dim1=1, dim2=2), torch.full((3, 7), math.sqrt(D), dtype=F64))
    assert torch.isnan(grid.tril(-1)[:, torch.ones(7, 7).tril(-1).bool()]).all()  # t > T undefined
    for t, T in [(1, 2), (1, 7), (3, 6), (2, 4), (6, 7)]:
        expected = torch.linalg.matrix_norm(rolled_jacobian(model, toks, t, T))
        assert (grid[:, t - 1, T - 1] - expected).abs().max() < 1e-10 * max(1.0, float(expected.max()))
    # a single-layer GRU reads out y = z, so the last column is the gradient flow
    if core == "gru":
        assert torch.allclose(grid[:, :, -1], gradient_flow(model, toks)[0], rtol=1e-10, atol=0)
    torch.testing.assert_close(tT_grid(model, toks, T_max=4), grid[:, :4, :4], rtol=0, atol=0, equal_nan=True)


def test_step_spectra_against_autograd_step_jacobians() -> None:
    model, toks = gru(core="lstm"), tokens()
    spectra = step_spectra(model, toks)
    with torch.no_grad():
        x = model.core_inputs(toks)
        _, zs = model.core.scan(x)
    prev = torch.cat([torch.zeros_like(zs[:, :1]), zs[:, :-1]], dim=1)
    D = model.core.state_dim
    assert spectra["radius"].shape == (3, 8) and spectra["singular_values"].shape == (3, 8, D)
    for b in range(3):
        for t in range(8):
            step = lambda z: model.core.step(x[b:b + 1, t], z[None])[1][0]  # noqa: B023, E731
            J = torch.autograd.functional.jacobian(step, prev[b, t])
            assert abs(spectra["radius"][b, t] - torch.linalg.eigvals(J).abs().max()) < 1e-10
            assert torch.allclose(spectra["singular_values"][b, t], torch.linalg.svdvals(J), atol=1e-10)
    top = step_spectra(model, toks, top_k=3)["singular_values"]
    # bit for bit: the same process and code path; top_k only slices
    assert torch.equal(top, spectra["singular_values"][..., :3])
    with pytest.raises(GradscopeError, match="top_k"):
        step_spectra(model, toks, top_k=D + 1)


def test_flow_rejects_bad_arguments() -> None:
    model = gru()
    with pytest.raises(GradscopeError, match="method"):
        gradient_flow(model, tokens(), method="analytic")
    with pytest.raises(GradscopeError, match="T"):
        gradient_flow(model, tokens(), T=9)
    with pytest.raises(GradscopeError, match="model"):
        gradient_flow(nn.GRU(3, 4), tokens())
