"""Sums over a state in float64 (gradscope.analysis.reduce): every public reduction of a score, a
companion statistic, a norm of the dynamics view, on float32 Jacobians of D = 46,080 columns, agrees
with the same quantity computed from float64 copies; and the Cauchy–Schwarz order of the scores holds
at that size. On float32 sums these failed: frobenius(A, A) came out 1.0047 at this size."""

from __future__ import annotations

import math

import pytest
import torch

from gradscope.analysis import reduce
from gradscope.analysis.dynamics import _spectral_norm
from gradscope.analysis.scores import (companion_stats, complex_similarity, default_score, frobenius_score, l1_score,
                                       row_cosines)
from gradscope.analysis.stability import wirtinger_score

D = 46_080
ROWS = 64


def _jacobians(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two float32 Jacobians (ROWS × D) whose columns span 1e-3 … 1 in scale, the second a perturbation."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-3, 0, D, dtype=torch.float64)
    a = torch.randn(ROWS, D, generator=gen, dtype=torch.float64) * scale
    b = a + 0.3 * torch.randn(ROWS, D, generator=gen, dtype=torch.float64) * scale
    return a.float(), b.float()


@pytest.fixture(scope="module")
def pair() -> tuple[torch.Tensor, torch.Tensor]:
    return _jacobians(0)


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float(((x.double() - ref) / ref.abs().clamp_min(1e-300)).abs().max())


@pytest.mark.parametrize("score", [default_score, frobenius_score, l1_score])
def test_scores_in_float32_agree_with_float64(pair: tuple, score) -> None:  # noqa: ANN001
    a, b = pair
    assert _rel(score(a, b), score(a.double(), b.double())) <= 1e-6
    assert score(a, b).dtype == torch.float32  # the inputs' dtype, from float64 sums


def test_frobenius_of_a_with_itself_is_one(pair: tuple) -> None:
    a, _ = pair
    assert abs(float(frobenius_score(a, a)) - 1.0) <= 1e-7
    assert abs(float(default_score(a, a)) - 1.0) <= 1e-7


def test_companions_and_row_cosines_agree_with_float64(pair: tuple) -> None:
    a, b = pair
    ya, yb = a[:, :ROWS].sum(-1), b[:, :ROWS].sum(-1)
    got = companion_stats(a, b, ya, yb, k=4)
    ref = companion_stats(a.double(), b.double(), ya.double(), yb.double(), k=4)
    for name in ("fro_a", "fro_b", "fro_diff", "cos_mean", "forward_sim"):
        assert _rel(got[name], ref[name]) <= 1e-6, name
    assert _rel(row_cosines(a, b), row_cosines(a.double(), b.double())) <= 1e-6


def test_complex_scores_agree_with_complex128(pair: tuple) -> None:
    a, b = pair
    ca, cb = torch.complex(a[:, 0::2], a[:, 1::2]), torch.complex(b[:, 0::2], b[:, 1::2])  # M = D / 2 modes
    got, ref = wirtinger_score(ca, cb), wirtinger_score(ca.to(torch.complex128), cb.to(torch.complex128))
    assert abs(complex(got) - complex(ref)) / abs(complex(ref)) <= 1e-6
    got, ref = complex_similarity(ca, cb), complex_similarity(ca.to(torch.complex128), cb.to(torch.complex128))
    assert float((got.to(torch.complex128) - ref).abs().max() / ref.abs().max()) <= 1e-6


def test_dynamics_norms_agree_with_float64(pair: tuple) -> None:
    a, b = pair
    g = torch.stack([a[:64], b[:64]])  # (B, H, D): the flow's ∂y_T/∂z_k, wide (D > 2H: the Gram path)
    assert _rel(reduce.fro64(g), torch.linalg.matrix_norm(g.double())) <= 1e-12
    assert _rel(_spectral_norm(g), torch.linalg.matrix_norm(g.double(), ord=2)) <= 1e-6


def test_cauchy_schwarz_order_at_size() -> None:
    """|default| ≥ |frobenius| ≥ |l1| on float32 Jacobians of D = 46,080, for several pairs."""
    for seed in range(3):
        a, b = _jacobians(seed + 1)
        d, f, l1 = (float(s(a, b)) for s in (default_score, frobenius_score, l1_score))
        assert abs(d) >= abs(f) >= abs(l1), (seed, d, f, l1)
        assert abs(float(frobenius_score(a, a))) <= 1.0 + 1e-7 and not math.isnan(d)


def test_dot_and_gram_chunking_is_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slicing the last dimension changes nothing but the order of float64 additions."""
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(3, 5, 37, generator=gen), torch.randn(3, 5, 37, generator=gen)
    whole = reduce.dot64(x, y, (-2, -1)), reduce.gram64(x)
    monkeypatch.setattr(reduce, "CHUNK", 7)
    torch.testing.assert_close(reduce.dot64(x, y, (-2, -1)), whole[0], rtol=1e-14, atol=0)
    torch.testing.assert_close(reduce.gram64(x), whole[1], rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(whole[0], (x.double() * y.double()).sum((-2, -1)), rtol=1e-14, atol=0)


@pytest.mark.parametrize("n", [5, reduce.SQUARES_BLOCK, 3 * reduce.SQUARES_BLOCK + 17])
def test_sums_of_squares_by_blocks_agree_with_float64(n: int) -> None:
    """The matrix-free estimators' ‖row‖² over a state: float64 result, within a few float32 ulps of the
    float64 sum whether n is below, at or past a block (a tail block), and float64 input summed in float64."""
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 4, n, generator=gen, dtype=torch.float64) * torch.logspace(-3, 3, n, dtype=torch.float64))
    ref = x.square().sum(-1)
    got = reduce.sumsq_blocks(x.float())
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, ref, rtol=4e-7, atol=0)
    torch.testing.assert_close(reduce.sumsq_blocks(x), ref, rtol=1e-13, atol=0)
