"""Gradient-stability scores (SPEC §4) against independent numpy/python references and closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from gradscope.analysis.scores import (SCORES, companion_stats, complex_similarity, effective_rank, real_view_columns,
                                       row_cosines, singular_values, similarity, subspace_similarity, wirtinger)
from gradscope.errors import GradscopeError

KINDS = list(SCORES)


def rand(seed: int, *shape: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def crand(seed: int, *shape: int) -> torch.Tensor:
    return torch.complex(rand(seed, *shape), rand(seed + 1000, *shape))


# --- independent references: plain python loops over rows --------------------------------------

def ref_score(a: np.ndarray, b: np.ndarray, kind: str) -> float:
    num = sum(float(np.dot(a[i], b[i])) for i in range(a.shape[0]))
    na = [math.sqrt(sum(x * x for x in row)) for row in a]
    nb = [math.sqrt(sum(x * x for x in row)) for row in b]
    if kind == "default":
        den = sum(x * y for x, y in zip(na, nb))
    elif kind == "frobenius":
        den = math.sqrt(sum(x * x for x in na)) * math.sqrt(sum(y * y for y in nb))
    else:
        den = sum(na) * sum(nb)
    return num / den if den > 0 else math.nan


def ref_row_cos(a: np.ndarray, b: np.ndarray) -> list[float]:
    out = []
    for ra, rb in zip(a, b):
        den = np.linalg.norm(ra) * np.linalg.norm(rb)
        out.append(float(ra @ rb / den) if den > 0 else math.nan)
    return out


matrices = st.integers(1, 5).flatmap(lambda r: st.integers(1, 5).flatmap(lambda c: st.tuples(*[
    arrays(np.float64, (r, c), elements=st.floats(-1e3, 1e3, allow_subnormal=False).map(
        lambda x: 0.0 if abs(x) < 1e-6 else x)) for _ in range(2)])))


# --- the scores -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(1, 1), (4, 7), (9, 3)])
def test_each_kind_matches_loop_reference(kind: str, shape: tuple[int, int]) -> None:
    for seed in range(3):
        a, b = rand(seed, *shape), rand(seed + 50, *shape)
        b[0] = -2.0 * a[0]  # an anti-aligned row, so the score is not trivially near 0
        got = similarity(a, b, kind)
        assert got.dtype == torch.float64 and got.shape == ()
        assert abs(got.item() - ref_score(a.numpy(), b.numpy(), kind)) < 1e-12


@pytest.mark.parametrize("kind", KINDS)
def test_batched_equals_one_by_one(kind: str) -> None:
    a, b = rand(1, 2, 3, 5, 4), rand(2, 2, 3, 5, 4)
    got = similarity(a, b, kind)
    assert got.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            assert abs(got[i, j].item() - ref_score(a[i, j].numpy(), b[i, j].numpy(), kind)) < 1e-12


@pytest.mark.parametrize("kind", ["default", "frobenius"])
def test_self_similarity_is_one(kind: str) -> None:
    a = rand(3, 6, 8)
    assert similarity(a, a, kind).item() == pytest.approx(1.0, abs=1e-12)


def test_l1_self_similarity_is_sum_sq_over_sq_sum() -> None:
    a = rand(4, 6, 8)
    n = np.linalg.norm(a.numpy(), axis=1)
    assert similarity(a, a, "l1").item() == pytest.approx((n ** 2).sum() / n.sum() ** 2, abs=1e-12)
    assert similarity(a, a, "l1").item() < 0.5


@pytest.mark.parametrize("kind", KINDS)
@given(pair=matrices, sa=st.floats(1e-3, 1e3), sb=st.floats(1e-3, 1e3))
@settings(max_examples=50, deadline=None)
def test_symmetry_and_positive_scaling(kind: str, pair: tuple[np.ndarray, np.ndarray], sa: float, sb: float) -> None:
    a, b = torch.from_numpy(pair[0]), torch.from_numpy(pair[1])
    s = similarity(a, b, kind)
    np.testing.assert_allclose(similarity(b, a, kind).item(), s.item(), rtol=0, atol=1e-12, equal_nan=True)
    np.testing.assert_allclose(similarity(sa * a, sb * b, kind).item(), s.item(), rtol=0, atol=1e-9, equal_nan=True)
    np.testing.assert_allclose(s.item(), ref_score(pair[0], pair[1], kind), rtol=0, atol=1e-9, equal_nan=True)


@given(pair=matrices)
@settings(max_examples=50, deadline=None)
def test_cauchy_schwarz_ordering(pair: tuple[np.ndarray, np.ndarray]) -> None:
    a, b = torch.from_numpy(pair[0]), torch.from_numpy(pair[1])
    d, f, l1 = (similarity(a, b, k).item() for k in ("default", "frobenius", "l1"))
    if math.isnan(d):  # no row non-zero in both: the numerator is 0 too
        assert math.isnan(f) or f == 0.0
        assert math.isnan(l1) or l1 == 0.0
        return
    assert -1 - 1e-12 <= d <= 1 + 1e-12
    assert abs(d) >= abs(f) - 1e-12
    assert abs(f) >= abs(l1) - 1e-12


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_all_zero_jacobian_is_nan(kind: str, dtype: torch.dtype) -> None:
    a, z = rand(5, 4, 3, dtype=dtype), torch.zeros(4, 3, dtype=dtype)
    for x, y in ((a, z), (z, a), (z, z)):
        assert torch.isnan(similarity(x, y, kind))
    batch = torch.stack([a, z])  # one good pair and one zero pair: only the zero one is NaN
    got = similarity(batch, torch.stack([a, a]), kind)
    assert not torch.isnan(got[0]) and torch.isnan(got[1])


def test_zero_row_contributes_nothing_to_default() -> None:
    a, b = rand(6, 5, 4), rand(7, 5, 4)
    for r in range(5):
        for x, y in ((a.clone(), b), (a, b.clone())):
            x, y = x.clone(), y.clone()
            x[r] = 0.0
            keep = [i for i in range(5) if i != r]
            assert similarity(x, y).item() == pytest.approx(similarity(a[keep], b[keep]).item(), abs=1e-12)
            assert similarity(x, y).item() != pytest.approx(similarity(a, b).item(), abs=1e-6)


def test_float32_agrees_with_float64() -> None:
    a, b = rand(8, 3, 6, 5), rand(9, 3, 6, 5)
    for kind in KINDS:
        got = similarity(a.float(), b.float(), kind)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), similarity(a, b, kind), atol=1e-5, rtol=0)


def test_bad_arguments_raise_gradscope_error() -> None:
    a = rand(0, 3, 4)
    with pytest.raises(GradscopeError, match="kind"):
        similarity(a, a, "cosine")
    with pytest.raises(GradscopeError, match="jb"):
        similarity(a, rand(1, 4, 3))
    with pytest.raises(GradscopeError, match="ja"):
        similarity(crand(0, 3, 4), crand(0, 3, 4))


def test_row_cosines_match_reference_and_nan_on_zero_rows() -> None:
    a, b = rand(10, 5, 4), rand(11, 5, 4)
    a[2] = 0.0
    got = row_cosines(a, b)
    assert got.shape == (5,)
    np.testing.assert_allclose(got.numpy(), ref_row_cos(a.numpy(), b.numpy()), rtol=0, atol=1e-12, equal_nan=True)
    assert torch.isnan(got[2]) and not torch.isnan(got[[0, 1, 3, 4]]).any()


# --- complex states (S4D) -----------------------------------------------------------------------

def test_real_view_dot_is_real_part_of_complex_similarity() -> None:
    for seed in range(5):
        a, b = crand(seed, 7), crand(seed + 20, 7)
        ra, rb = torch.view_as_real(a).flatten(), torch.view_as_real(b).flatten()
        real_cos = (ra @ rb / (ra.norm() * rb.norm())).item()
        ref = (a.numpy() * np.conj(b.numpy())).sum() / (np.linalg.norm(a.numpy()) * np.linalg.norm(b.numpy()))
        got = complex_similarity(a, b)
        assert got.is_complex()
        assert got.real.item() == pytest.approx(real_cos, abs=1e-12)
        assert complex(got.item()) == pytest.approx(complex(ref), abs=1e-12)
    assert torch.isnan(complex_similarity(torch.zeros(3, dtype=torch.complex128), crand(0, 3)).real)


def test_similarity_of_real_views_is_complex_default_score() -> None:
    a, b = crand(30, 4, 6), crand(40, 4, 6)
    ra, rb = real_view_columns(a), real_view_columns(b)
    assert ra.shape == (4, 12) and ra.dtype == torch.float64
    assert torch.equal(ra[:, 0::2], a.real) and torch.equal(ra[:, 1::2], a.imag)
    an, bn = a.numpy(), b.numpy()
    num = sum(complex(np.sum(an[i] * np.conj(bn[i]))) for i in range(4))
    den = sum(np.linalg.norm(an[i]) * np.linalg.norm(bn[i]) for i in range(4))
    assert similarity(ra, rb).item() == pytest.approx(num.real / den, abs=1e-12)
    assert similarity(ra, real_view_columns(a * np.exp(0j))).item() == pytest.approx(1.0, abs=1e-12)
    # a common phase e^{iθ} scores cos θ: the real view sees only Re⟨a, b̄⟩
    theta = 0.7
    rot = real_view_columns(a * complex(math.cos(theta), math.sin(theta)))
    assert similarity(ra, rot).item() == pytest.approx(math.cos(theta), abs=1e-12)


def test_wirtinger_of_re_cz_is_half_conj_c() -> None:
    c = crand(50, 3)  # f_m(z) = Re(c_m z_m): ∂f/∂x = Re c, ∂f/∂y = −Im c ⇒ ½(∂x + i∂y) = ½ conj(c)
    z0 = torch.view_as_real(crand(60, 3)).flatten()

    def f(zr: torch.Tensor) -> torch.Tensor:
        return (c * torch.view_as_complex(zr.reshape(3, 2))).real  # (3,)

    j_real = torch.autograd.functional.jacobian(f, z0)  # (3, 6), brute force
    assert j_real.dtype == torch.float64
    got = wirtinger(j_real)
    assert got.shape == (3, 3) and got.dtype == torch.complex128
    expected = torch.diag(torch.complex(0.5 * c.real, -0.5 * c.imag))
    torch.testing.assert_close(got, expected, atol=1e-14, rtol=0)
    torch.testing.assert_close(real_view_columns(2 * got), j_real, atol=1e-14, rtol=0)


def test_wirtinger_s4d_closed_form() -> None:
    # SPEC oracle: ∂(2 Re(w·x))/∂(Re x, Im x) = (2a, −2b) for w = a + ib, so J_c = a − ib = conj(w)
    w = crand(70, 1, 5)
    j_real = real_view_columns(torch.complex(2 * w.real, -2 * w.imag))
    torch.testing.assert_close(wirtinger(j_real), w.conj(), atol=1e-15, rtol=0)
    assert wirtinger(j_real.float()).dtype == torch.complex64


# --- companion statistics ---------------------------------------------------------------------------

def test_singular_values_match_numpy() -> None:
    j = rand(80, 2, 5, 7)
    got = singular_values(j)
    assert got.shape == (2, 5)
    np.testing.assert_allclose(got.numpy(), np.linalg.svd(j.numpy(), compute_uv=False), rtol=0, atol=1e-12)


def test_effective_rank_known_values() -> None:
    eye, rank1 = torch.eye(6, dtype=torch.float64), torch.outer(rand(81, 6), rand(82, 4))
    assert effective_rank(singular_values(eye)).item() == pytest.approx(6.0, abs=1e-12)
    assert effective_rank(singular_values(rank1)).item() == pytest.approx(1.0, abs=1e-9)
    assert torch.isnan(effective_rank(singular_values(torch.zeros(3, 4, dtype=torch.float64))))
    s = np.linalg.svd(rand(83, 5, 8).numpy(), compute_uv=False)
    p = s / s.sum()
    ref = math.exp(-sum(x * math.log(x) for x in p))
    assert effective_rank(torch.from_numpy(s)).item() == pytest.approx(ref, abs=1e-12)
    assert 1.0 < ref < 5.0


def test_subspace_similarity_same_and_orthogonal_column_spaces() -> None:
    ja = rand(90, 8, 3)
    r = rand(91, 3, 3) + 3 * torch.eye(3, dtype=torch.float64)  # invertible
    assert subspace_similarity(ja, ja @ r, k=3).item() == pytest.approx(1.0, abs=1e-12)
    assert subspace_similarity(ja, rand(92, 8, 3), k=3).item() < 0.9  # a different 3-d subspace of R^8
    q, _ = torch.linalg.qr(rand(93, 8, 8))
    jo_a, jo_b = q[:, :3] @ rand(94, 3, 5), q[:, 3:6] @ rand(95, 3, 5)
    assert subspace_similarity(jo_a, jo_b, k=3).item() == pytest.approx(0.0, abs=1e-12)
    assert torch.isnan(subspace_similarity(ja, torch.zeros(8, 3, dtype=torch.float64), k=3))


def test_subspace_similarity_matches_scipy_principal_angles() -> None:
    ja, jb = rand(100, 2, 6, 9), rand(101, 2, 6, 9)
    for k in (1, 2, 4, 6):
        got = subspace_similarity(ja, jb, k=k)
        for i in range(2):
            ua, ub = np.linalg.svd(ja[i].numpy())[0][:, :k], np.linalg.svd(jb[i].numpy())[0][:, :k]
            ref = np.mean(np.cos(scipy.linalg.subspace_angles(ua, ub)) ** 2)
            assert got[i].item() == pytest.approx(ref, abs=1e-10)
    torch.testing.assert_close(subspace_similarity(ja, jb), subspace_similarity(ja, jb, k=3))  # default k
    # bit for bit: k is clipped before any arithmetic (the same call)
    assert torch.equal(subspace_similarity(ja, jb, k=100), subspace_similarity(ja, jb, k=6))  # clipped
    with pytest.raises(GradscopeError, match="k"):
        subspace_similarity(ja, jb, k=0)


def test_companion_stats_against_numpy() -> None:
    ja, jb = rand(110, 3, 6, 5), rand(111, 3, 6, 5)
    ja[0, 1] = 0.0  # a NaN row cosine, skipped by mean/min/max
    ya, yb = rand(112, 3, 6), rand(113, 3, 6)
    st_ = companion_stats(ja, jb, ya, yb)
    keys = {"cos_mean", "cos_min", "cos_max", "fro_a", "fro_b", "fro_diff", "spectral_a", "spectral_b",
            "eff_rank_a", "eff_rank_b", "subspace_sim", "forward_sim"}
    assert set(st_) == keys and all(v.shape == (3,) for v in st_.values())
    for i in range(3):
        a, b = ja[i].numpy(), jb[i].numpy()
        cos = [c for c in ref_row_cos(a, b) if not math.isnan(c)]
        assert st_["cos_mean"][i].item() == pytest.approx(sum(cos) / len(cos), abs=1e-12)
        assert st_["cos_min"][i].item() == pytest.approx(min(cos), abs=1e-12)
        assert st_["cos_max"][i].item() == pytest.approx(max(cos), abs=1e-12)
        assert st_["cos_min"][i] <= st_["cos_mean"][i] <= st_["cos_max"][i]
        assert st_["fro_a"][i].item() == pytest.approx(np.linalg.norm(a), abs=1e-12)
        assert st_["fro_b"][i].item() == pytest.approx(np.linalg.norm(b), abs=1e-12)
        assert st_["fro_diff"][i].item() == pytest.approx(np.linalg.norm(a - b), abs=1e-12)
        assert st_["spectral_a"][i].item() == pytest.approx(np.linalg.norm(a, 2), abs=1e-12)
        assert st_["spectral_b"][i].item() == pytest.approx(np.linalg.norm(b, 2), abs=1e-12)
        fa, fb = ya[i].numpy(), yb[i].numpy()
        assert st_["forward_sim"][i].item() == pytest.approx(fa @ fb / np.linalg.norm(fa) / np.linalg.norm(fb),
                                                               abs=1e-12)
    torch.testing.assert_close(st_["eff_rank_a"], effective_rank(singular_values(ja)))
    torch.testing.assert_close(st_["subspace_sim"], subspace_similarity(ja, jb))
    assert st_["cos_min"][0] < st_["cos_max"][0]


def test_companion_stats_all_nan_rows_and_zero_matrix() -> None:
    ja, z = rand(120, 4, 3), torch.zeros(4, 3, dtype=torch.float64)
    st_ = companion_stats(ja, z, rand(121, 4), torch.zeros(4, dtype=torch.float64))
    for key in ("cos_mean", "cos_min", "cos_max", "eff_rank_b", "subspace_sim", "forward_sim"):
        assert torch.isnan(st_[key]), key
    assert st_["fro_b"].item() == 0.0 and not torch.isnan(st_["eff_rank_a"])


def test_precomputed_svd_gives_the_same_statistics() -> None:
    from gradscope.analysis.scores import companion_stats
    g = torch.Generator().manual_seed(5)
    ja, jb = torch.randn(4, 2, 6, 9, generator=g, dtype=torch.float64), torch.randn(4, 2, 6, 9, generator=g,
                                                                                       dtype=torch.float64)
    ya, yb = torch.randn(4, 2, 6, generator=g, dtype=torch.float64), torch.randn(4, 2, 6, generator=g,
                                                                                 dtype=torch.float64)
    svd = lambda j: tuple(torch.linalg.svd(j, full_matrices=False)[:2])  # noqa: E731
    plain = companion_stats(ja, jb, ya, yb)
    reused = companion_stats(ja, jb, ya, yb, svd_a=svd(ja), svd_b=svd(jb))
    for name in plain:
        torch.testing.assert_close(plain[name], reused[name], equal_nan=True)
