"""bench/dynamics.py's baselines stay correct: at tiny size in float64, the published-method (calc_LEs_an)
re-implementation in the J·Q convention equals gradscope's Lyapunov engine, and in the published Jᵀ·Q
convention runs and differs (the transposed cocycle). The bench is a script, not a package: it is loaded
from its path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from gradscope.analysis.dynamics import trajectory_tokens
from gradscope.analysis.lyapunov import lyapunov_spectrum

BENCH = Path(__file__).resolve().parents[2] / "bench" / "dynamics.py"


@pytest.fixture(scope="module")
def bench():  # noqa: ANN201
    spec = importlib.util.spec_from_file_location("bench_dynamics", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny(bench, core: str, H: int = 12, B: int = 3, T: int = 40):  # noqa: ANN001, ANN201
    """A float64 model with W_hh scaled ×3 (default init contracts everything fast) and its inputs (B, T, in)."""
    model = bench.build(core, H, seed=3).double()
    with torch.no_grad():
        model.core.rnn.weight_hh_l0.mul_(3.0)
        x = model.core_inputs(trajectory_tokens(bench.K, T, B, seed=4))
    return model, x


@pytest.mark.parametrize("core", ["gru", "elman", "lstm"])
def test_published_jq_equals_gradscope(bench, core: str) -> None:
    """GRU and Elman through the analytic path, the LSTM (h, c) through the autograd path."""
    model, x = tiny(bench, core)
    ref = lyapunov_spectrum(model.core, x, warmup=5).exponents
    got = bench.published_method(model, x, 5, transpose=False)
    assert got.dtype == torch.float64 and got.shape == ref.shape == (x.shape[0], model.core.state_dim)
    assert (got - ref).abs().max() < 1e-8
    assert ref.std() > 0.1  # a spread spectrum, not a degenerate one any method would match


def test_published_jtq_runs_and_differs(bench) -> None:
    model, x = tiny(bench, "gru")
    ref = lyapunov_spectrum(model.core, x, warmup=5).exponents
    got = bench.published_method(model, x, 5, transpose=True)
    assert torch.isfinite(got).all() and got.shape == ref.shape
    assert (got - ref).abs().max() > 1e-3


def test_published_analytic_jacobian_equals_autograd_path(bench) -> None:
    """The GRU's analytic step Jacobian (dense diagonal factors) against the method's own autograd path."""
    model, x = tiny(bench, "gru")
    z = torch.randn(x.shape[0], model.core.state_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    rnn = model.core.rnn
    analytic = bench.published_jacobian_analytic(rnn, x[:, 0], z)
    assert torch.allclose(analytic, bench.published_jacobian_autograd(rnn, x[:, 0], z), atol=1e-12, rtol=0)
