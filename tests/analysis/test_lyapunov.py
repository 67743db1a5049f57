"""Error bars on Lyapunov exponents (issue #37, part 4): batch-means and over-trajectory standard errors
against products of Gaussian matrices, whose exponents are known in closed form and whose per-step
log|R_ii| are independent (so a stated error bar must cover the truth at its nominal rate); the
batch-means numbers against an independent per-step autograd + QR loop through a fused nn.GRU; the
convergence check on a stationary and on a drifting system (the store, the CLI table and old stores:
tests/store/test_dynamics.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import digamma
from torch import Tensor, nn

from gradscope.analysis.lyapunov import lyapunov_spectrum

F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class GaussianProduct(nn.Module):
    """z_t = G_t z_{t−1}, G_t = the input x_t (B, D·D) as a D × D matrix, so J_t = G_t."""

    def __init__(self, D: int) -> None:
        super().__init__()
        self.state_dim = self.out_dim = D

    def step(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        z = torch.einsum("bij,bj->bi", x.reshape(-1, self.state_dim, self.state_dim), z)
        return z, z

    def step_jacobian(self, x: Tensor, z: Tensor) -> Tensor:
        return x.reshape(-1, self.state_dim, self.state_dim)


def gaussian_exponents(D: int) -> Tensor:
    """Newman (1986): a product of D × D matrices with i.i.d. N(0, 1) entries has
    λ_i = (log 2 + ψ((D − i + 1)/2)) / 2: R_ii² of G·Q is χ² with D − i + 1 degrees of freedom for any Q."""
    return torch.tensor([0.5 * (math.log(2) + float(digamma((D - i) / 2))) for i in range(D)], dtype=F64)


def gaussian_run(seed: int, B: int, T: int, D: int = 3, **kwargs: object):  # noqa: ANN201
    x = torch.randn(B, T, D * D, generator=gen(seed), dtype=F64)
    return lyapunov_spectrum(GaussianProduct(D), x, warmup=5, z0=torch.ones(B, D, dtype=F64), **kwargs)


def test_error_bars_cover_known_exponents_at_their_nominal_rate() -> None:
    D, true = 3, gaussian_exponents(3)
    batch_hits, traj_hits, ratios = [], [], []
    for seed in range(12):  # 12 seeds × 16 trajectories × 3 exponents: 576 batch-means intervals
        res = gaussian_run(seed, B=16, T=205, D=D)
        assert res.se_batch.shape == res.exponents.shape == (16, D) and res.batches == 10
        batch_hits.append(((res.exponents - true).abs() <= 2 * res.se_batch).double().mean())
        traj_hits.append(((res.exponents.mean(0) - true).abs() <= 2 * res.se_trajectories()).double().mean())
        combined = (res.se_batch ** 2).sum(0).sqrt() / 16  # the batch errors of the mean over trajectories
        ratios.append(res.se_trajectories() / combined)
    batch_rate, traj_rate = float(torch.stack(batch_hits).mean()), float(torch.stack(traj_hits).mean())
    # nominal: 2 SE of a t with 9 (batch) and 15 (trajectories) degrees of freedom: 0.92 and 0.94
    assert 0.86 <= batch_rate <= 0.97, batch_rate
    assert 0.80 <= traj_rate <= 1.0, traj_rate
    ratio = torch.stack(ratios)
    assert 0.75 <= float(ratio.mean()) <= 1.3, ratio  # two estimators of one spread agree
    assert float(res.se_batch.mean()) > 0.01  # the bars are not vacuous: 200 steps leave real noise


def test_error_bars_shrink_like_one_over_root_steps() -> None:
    short, long = gaussian_run(1, B=8, T=105), gaussian_run(1, B=8, T=1605)
    ratio = float(short.se_batch.mean() / long.se_batch.mean())
    assert 2.8 <= ratio <= 5.5, ratio  # sqrt(1600 / 100) = 4
    assert ((long.exponents.mean(0) - gaussian_exponents(3)).abs() <= 3 * long.se_trajectories()).all()


def test_batch_means_match_an_independent_per_step_qr_loop_through_a_fused_gru() -> None:
    from tests.analysis.test_dynamics import fused_step, wrapped  # the brute force's own step

    model = wrapped(nn.GRU, scale=1.0)
    rnn = model.core.rnn
    x = torch.randn(2, 83, 3, generator=gen(3), dtype=F64)
    warmup, batches = 3, 4
    res = lyapunov_spectrum(model.core, x, warmup=warmup, batches=batches)
    D = 4
    for s in range(2):
        z, Q, series = x.new_zeros(D), torch.eye(D, dtype=F64), []
        for t in range(x.shape[1]):
            J = torch.autograd.functional.jacobian(lambda v: fused_step(rnn, x[s, t], v), z)  # noqa: B023
            Q, R = torch.linalg.qr(J @ Q)
            if t >= warmup:
                series.append(R.diagonal().abs().log())
            with torch.no_grad():
                z = fused_step(rnn, x[s, t], z)
        logs = torch.stack(series).numpy()  # (80, D): 4 blocks of 20 steps
        means = logs.reshape(batches, 20, D).mean(1)
        lam = logs.mean(0)
        se = np.sqrt(((means - lam) ** 2).sum(0) / (batches - 1) / batches)
        drift = means[2:].mean(0) - means[:2].mean(0)
        order = np.argsort(-lam)
        np.testing.assert_allclose(res.exponents[s].numpy(), lam[order], atol=1e-9)
        np.testing.assert_allclose(res.se_batch[s].numpy(), se[order], rtol=1e-6, atol=1e-10)
        np.testing.assert_allclose(res.drift[s].numpy(), drift[order], rtol=1e-6, atol=1e-10)


def test_convergence_check_passes_a_stationary_map_and_flags_a_drifting_one() -> None:
    from tests.analysis.test_dynamics import LinearCore, rotation

    blocks = [rotation(0.9, 0.3), torch.tensor([[1.05]], dtype=F64), torch.tensor([[-0.5]], dtype=F64)]
    Q, _ = torch.linalg.qr(torch.randn(4, 4, generator=gen(0), dtype=F64))
    W = Q @ torch.block_diag(*blocks) @ Q.T  # orthogonal × block-diagonal × orthogonal: |eig| = 1.05, 0.9, 0.9, 0.5
    core = LinearCore(W, torch.randn(4, 2, generator=gen(1), dtype=F64))
    x = torch.randn(3, 1100, 2, generator=gen(2), dtype=F64)
    res = lyapunov_spectrum(core, x, warmup=100)
    true = torch.tensor([math.log(1.05), math.log(0.9), math.log(0.9), math.log(0.5)], dtype=F64)
    assert (res.exponents - true).abs().max() < 1e-3 and not res.unconverged.any()
    cold = lyapunov_spectrum(core, x, warmup=0)  # the frame's transient inside the window
    err = (cold.running - true).abs().amax(dim=(0, 2))  # running estimates converge, like 1/steps
    assert err[0] > 1e-2 and err[-1] < err[0] / 50
    # a drifting system: the Gaussian product scaled by exp(t / 400): exponents grow over the window
    x = torch.randn(8, 805, 9, generator=gen(4), dtype=F64) * torch.exp(torch.arange(805, dtype=F64) / 400)[:, None]
    drifting = lyapunov_spectrum(GaussianProduct(3), x, warmup=5, z0=torch.ones(8, 3, dtype=F64))
    assert drifting.unconverged.double().mean() > 0.9 and (drifting.drift > 0).all()
    stationary = gaussian_run(5, B=32, T=805)
    assert stationary.unconverged.double().mean() < 0.05  # |t| > 4 with 8 degrees of freedom: 0.4% nominal


def test_structured_engine_carries_error_bars_and_exact_blocks_have_none() -> None:
    from gradscope.models import S4DCore

    torch.manual_seed(0)
    core = S4DCore(3, 4, 1, 6, 0.01, 0.5).double()  # diagonal dA: constant log|d| per step → zero spread
    res = lyapunov_spectrum(core, torch.randn(2, 120, 3, generator=gen(2), dtype=F64), warmup=20)
    assert res.engine == "structured" and res.se_batch.shape == res.exponents.shape
    assert res.se_batch.abs().max() < 1e-12 and not res.unconverged.any()
    assert torch.isfinite(res.drift).all()


def test_bad_batches_is_refused() -> None:
    from gradscope.errors import GradscopeError

    with pytest.raises(GradscopeError, match="batches: got 0"):
        gaussian_run(0, B=2, T=20, batches=0)


def test_a_large_spectrum_keeps_a_bounded_running_history(monkeypatch: pytest.MonkeyPatch) -> None:
    """The running estimate's history holds at most RUNNING_NUMBERS numbers a trajectory (real-size states
    keep millions of exponents): its interval widens to a multiple of checkpoint_every, the last snapshot
    is still the final estimate, and the exponents are the same as with the full history."""
    from gradscope.analysis import lyapunov

    full = gaussian_run(3, B=2, T=205, D=3)
    assert full.running_steps.tolist() == list(range(10, 201, 10))  # 3 × 20 numbers: far below the cap
    monkeypatch.setattr(lyapunov, "RUNNING_NUMBERS", 3 * 5)  # room for 4 snapshots of 3, and the end
    capped = gaussian_run(3, B=2, T=205, D=3)
    assert capped.running_steps.tolist() == [50, 100, 150, 200]
    assert capped.running.shape == (2, 4, 3) and capped.running.numel() // 2 <= 3 * 5
    assert lyapunov.running_snapshots(200, 3) >= len(capped.running_steps)  # what the plan's memory counts
    torch.testing.assert_close(capped.exponents, full.exponents, rtol=0, atol=0)
    torch.testing.assert_close(capped.running[:, -1], full.running[:, -1], rtol=0, atol=0)
    torch.testing.assert_close(capped.running[:, 0], full.running[:, 4], rtol=0, atol=0)
