"""Gradient-stability scores and companion statistics of Jacobian pairs (pure tensor functions; docs/definitions.md §4).

A Jacobian is a real tensor of shape (..., D_out, D_in); row i is the gradient g_i of output i with
respect to the D_in state values. Leading batch dims (e.g. one per probe triplet) broadcast. A score
whose denominator is 0 (an all-zero Jacobian, say) is NaN, never 0, so it cannot be averaged in
silently. A Jacobian with a NaN or Inf entry (a diverged model) gives NaN statistics, never an
exception (see `finite_only`). Complex states (S4D) are handled through their real view; see `real_view_columns` and
`wirtinger`. Every sum over a row or a Jacobian accumulates in float64 (:mod:`gradscope.analysis.reduce`),
whatever the Jacobians' dtype; results come back in the inputs' (promoted) dtype.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from gradscope.analysis.reduce import dot64, fro64, norm64
from gradscope.errors import check
from gradscope.fields import DEFAULT_SCORE

NAN = float("nan")


def finite_matrices(j: Tensor) -> Tensor:
    """Which matrices of j (..., m, n) have only finite entries: bool (...)."""
    return j.isfinite().all(-1).all(-1)


def finite_only(fn: Callable[[Tensor], Tensor], j: Tensor, fill: float = NAN) -> Tensor:
    """``fn`` (a decomposition of each matrix of j (..., m, n), returning (..., *)) on the finite
    matrices only, ``fill`` (NaN) for the others. LAPACK fails to converge on a matrix with a NaN
    or Inf entry, and MKL's eigenvalue routine even crashes the process, so a diverged model's
    Jacobians are zeroed before the call and their results marked NaN afterwards. All-finite
    input is passed to ``fn`` untouched (the same numbers, bit for bit)."""
    ok = finite_matrices(j)
    if bool(ok.all()):
        return fn(j)
    out = fn(j.where(ok[..., None, None], 0.0))
    return out.masked_fill(~ok.reshape(tuple(ok.shape) + (1,) * (out.dim() - ok.dim())), fill)


def svd_or_nan(j: Tensor) -> tuple[Tensor, Tensor]:
    """Thin SVD (U, S) of each matrix of j (..., m, n) (``torch.linalg.svd``); NaN for a matrix
    with a non-finite entry (see :func:`finite_only`)."""
    ok = finite_matrices(j)
    if bool(ok.all()):
        u, s, _ = torch.linalg.svd(j, full_matrices=False)
        return u, s
    u, s, _ = torch.linalg.svd(j.where(ok[..., None, None], 0.0), full_matrices=False)
    return u.masked_fill(~ok[..., None, None], NAN), s.masked_fill(~ok[..., None], NAN)


def _check_pair(ja: Tensor, jb: Tensor) -> None:
    for name, j in (("ja", ja), ("jb", jb)):
        check(j.ndim >= 2 and j.is_floating_point(),
              f"{name}: got a {j.dtype} tensor of shape {tuple(j.shape)}; expected a real floating Jacobian "
              "(..., D_out, D_in) (use real_view_columns for complex ones)")
    check(ja.shape[-2:] == jb.shape[-2:],
          f"jb: got trailing shape {tuple(jb.shape[-2:])}; expected ja's (D_out, D_in) = {tuple(ja.shape[-2:])}")


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    """num / den, NaN wherever den == 0."""
    return torch.where(den > 0, num / den.where(den > 0, 1.0), NAN)


def _rows(ja: Tensor, jb: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(row dot products, row norms of A, row norms of B), each (..., D_out), accumulated in float64."""
    return dot64(ja, jb), norm64(ja), norm64(jb)


def _like(x: Tensor, *inputs: Tensor) -> Tensor:
    """A float64 result in the inputs' promoted dtype (float64 inputs: unchanged)."""
    dtype = inputs[0].dtype
    for t in inputs[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return x.to(dtype)


def default_score(ja: Tensor, jb: Tensor) -> Tensor:
    """S = Σ_i ⟨g_i^A, g_i^B⟩ / Σ_i ‖g_i^A‖‖g_i^B‖: row cosines weighted by ‖g_i^A‖‖g_i^B‖. (...)

    The reference code's `weighted_mean_gradient_similarity`. S(A, A) = 1; rows zero in either
    Jacobian add 0 to both sums; NaN when no row is non-zero in both.
    """
    dots, na, nb = _rows(ja, jb)
    return _like(_ratio(dots.sum(-1), (na * nb).sum(-1)), ja, jb)


def frobenius_score(ja: Tensor, jb: Tensor) -> Tensor:
    """S = ⟨J^A, J^B⟩_F / (‖J^A‖_F ‖J^B‖_F), i.e. weights α_i = ‖g_i‖ / sqrt(Σ_k ‖g_k‖²). (...)"""
    num = dot64(ja, jb, (-2, -1))
    return _like(_ratio(num, fro64(ja) * fro64(jb)), ja, jb)


def l1_score(ja: Tensor, jb: Tensor) -> Tensor:
    """S = Σ_i ⟨g_i^A, g_i^B⟩ / (Σ_k ‖g_k^A‖ · Σ_k ‖g_k^B‖), weights α_i = ‖g_i‖ / Σ_k ‖g_k‖. (...)

    Not 1 at A = B (it is Σ‖g_i‖² / (Σ‖g_k‖)² ≤ 1). By Cauchy–Schwarz |default| ≥ |frobenius| ≥ |l1|.
    """
    dots, na, nb = _rows(ja, jb)
    return _like(_ratio(dots.sum(-1), na.sum(-1) * nb.sum(-1)), ja, jb)


SCORES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "default": default_score,
    "frobenius": frobenius_score,
    "l1": l1_score,
}


def similarity(ja: Tensor, jb: Tensor, kind: str = DEFAULT_SCORE) -> Tensor:
    """Gradient-stability score of two Jacobians (..., D_out, D_in) → (...), in [−1, 1]; see `SCORES`."""
    check(kind in SCORES, f"kind: got {kind!r}; valid values are {', '.join(SCORES)}")
    _check_pair(ja, jb)
    return SCORES[kind](ja, jb)


def row_cosines(ja: Tensor, jb: Tensor) -> Tensor:
    """Cosine of each row pair ⟨g_i^A, g_i^B⟩ / (‖g_i^A‖‖g_i^B‖): (..., D_out), NaN where a row is zero."""
    _check_pair(ja, jb)
    dots, na, nb = _rows(ja, jb)
    return _like(_ratio(dots, na * nb), ja, jb)


def singular_values(j: Tensor) -> Tensor:
    """Singular values of j (..., D_out, D_in) → (..., min(D_out, D_in)), descending (NaN for a
    matrix with a non-finite entry)."""
    return finite_only(torch.linalg.svdvals, j)


def effective_rank(sigma: Tensor) -> Tensor:
    """Effective rank from singular values (..., R) → (...): exp(−Σ_j p_j log p_j), p_j = σ_j / Σσ.

    Roy & Vetterli (2007): between 1 (rank one) and R (all σ equal); 0 log 0 = 0; NaN if all σ = 0.
    """
    wide = sigma.double()
    p = _ratio(wide, wide.sum(-1, keepdim=True))
    plogp = torch.where(p > 0, p * torch.log(p.where(p > 0, 1.0)), 0.0)
    return torch.exp(-plogp.sum(-1)).where(~p.isnan().any(-1), NAN).to(sigma.dtype)


def subspace_similarity(ja: Tensor, jb: Tensor, k: int | None = None,
                        svd_a: tuple[Tensor, Tensor] | None = None,
                        svd_b: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Mean cos² of the principal angles between the top-k left singular subspaces of ja, jb. (...)

    With Q_A, Q_B (..., D_out, k) the top-k left singular vectors, this is ‖Q_Aᵀ Q_B‖_F² / k, the mean
    squared singular value of Q_Aᵀ Q_B, in [0, 1]. k defaults to max(1, min(D_out, D_in) // 2): when
    D_out ≤ D_in the full column space of a full-rank Jacobian is all of R^D_out and would score 1 for
    any pair, so the default compares the dominant half of the output directions. Pass
    k = min(D_out, D_in) to compare whole column spaces. k is clipped to min(D_out, D_in); NaN where
    σ_k = 0 in either Jacobian (the top-k subspace is then not determined). ``svd_a``/``svd_b``:
    precomputed (U, S) of ja/jb (thin SVD), so callers decompose each Jacobian once.
    """
    _check_pair(ja, jb)
    limit = min(ja.shape[-2], ja.shape[-1])
    check(k is None or k >= 1, f"k: got {k}; expected a positive int or None")
    k = max(1, limit // 2) if k is None else min(k, limit)
    ua, sa = svd_a if svd_a is not None else svd_or_nan(ja)
    ub, sb = svd_b if svd_b is not None else svd_or_nan(jb)
    overlap = ua[..., :k].double().transpose(-2, -1) @ ub[..., :k].double()  # (..., k, k), float64 sums
    sim = overlap.square().sum((-2, -1)) / k
    return _like(sim.where((sa[..., k - 1] > 0) & (sb[..., k - 1] > 0), NAN), ja, jb)


def _nan_extreme(x: Tensor, largest: bool) -> Tensor:
    """Max (or min) over the last dim ignoring NaN; NaN if every entry is NaN."""
    fill = -torch.inf if largest else torch.inf
    filled = x.where(~x.isnan(), fill)
    out = filled.amax(-1) if largest else filled.amin(-1)
    return out.where(~x.isnan().all(-1), NAN)


def companion_stats(ja: Tensor, jb: Tensor, ya: Tensor, yb: Tensor, k: int | None = None,
                    svd_a: tuple[Tensor, Tensor] | None = None,
                    svd_b: tuple[Tensor, Tensor] | None = None) -> dict[str, Tensor]:
    """Per-pair statistics beside the score; Jacobians (..., D_out, D_in), outputs ya, yb (..., D_out).

    Every entry has shape (...): cos_mean / cos_min / cos_max (unweighted over rows, NaN rows skipped),
    fro_a, fro_b (‖J‖_F), fro_diff (‖J^A − J^B‖_F), spectral_a/b (σ_max), eff_rank_a/b
    (`effective_rank`), subspace_sim (`subspace_similarity` with k), forward_sim (cosine of ya, yb).
    ``svd_a``/``svd_b``: precomputed thin-SVD (U, S) of ja/jb, to decompose each Jacobian only once.
    """
    _check_pair(ja, jb)
    check(ya.shape[-1] == ja.shape[-2] and yb.shape[-1] == ja.shape[-2],
          f"ya, yb: got trailing sizes {ya.shape[-1]}, {yb.shape[-1]}; expected D_out = {ja.shape[-2]}")
    cos = row_cosines(ja, jb)  # (..., D_out)
    svd_a = svd_a if svd_a is not None else svd_or_nan(ja)
    svd_b = svd_b if svd_b is not None else svd_or_nan(jb)
    sa, sb = svd_a[1], svd_b[1]  # (..., R)
    return {
        "cos_mean": torch.nanmean(cos, dim=-1),
        "cos_min": _nan_extreme(cos, largest=False),
        "cos_max": _nan_extreme(cos, largest=True),
        "fro_a": _like(fro64(ja), ja),
        "fro_b": _like(fro64(jb), jb),
        "fro_diff": _like(fro64(ja - jb), ja, jb),
        "spectral_a": sa[..., 0],
        "spectral_b": sb[..., 0],
        "eff_rank_a": effective_rank(sa),
        "eff_rank_b": effective_rank(sb),
        "subspace_sim": subspace_similarity(ja, jb, k, svd_a, svd_b),
        "forward_sim": forward_similarity(ya, yb),
    }


def forward_similarity(ya: Tensor, yb: Tensor) -> Tensor:
    """Cosine of the outputs ya, yb (..., D_out) → (...); NaN where either is zero."""
    dot, na, nb = _rows(ya, yb)
    return _like(_ratio(dot, na * nb), ya, yb)


def real_view_columns(jc: Tensor) -> Tensor:
    """Complex Jacobian (..., D_out, M) → real (..., D_out, 2M), columns (Re, Im) interleaved per input.

    The layout of `torch.view_as_real(z).flatten()` for a complex state z (M,). For a real output f,
    the complex gradient row g = ∂f/∂x + i ∂f/∂y maps to the real Jacobian row, so
    real_view_columns(2 · wirtinger(J)) == J. Real dot products of these rows equal Re Σ a·conj(b).
    """
    check(jc.is_complex(), f"jc: got dtype {jc.dtype}; expected a complex tensor")
    return torch.view_as_real(jc).flatten(-2)


def wirtinger(j_real: Tensor) -> Tensor:
    """Conjugate-Wirtinger Jacobian J_c = ½(∂/∂x + i ∂/∂y): real (..., D_out, 2M) → complex (..., D_out, M).

    j_real's columns are interleaved (x_m, y_m) as by `real_view_columns`. For real f, J_c = ∂f/∂z̄;
    e.g. f(z) = Re(c·z) gives J_c = ½·conj(c).
    """
    check(j_real.is_floating_point() and j_real.shape[-1] % 2 == 0,
          f"j_real: got dtype {j_real.dtype}, shape {tuple(j_real.shape)}; expected real with an even last dim")
    return 0.5 * torch.complex(j_real[..., 0::2], j_real[..., 1::2])


def complex_similarity(ga: Tensor, gb: Tensor) -> Tensor:
    """Σ_m a_m·conj(b_m) / (‖a‖‖b‖) over the last dim: complex (..., M) → complex (...); NaN if a norm is 0.

    Its real part equals the cosine of the real views (view_as_real, flattened), so the real-view
    score is Re of the complex one and perfect alignment (b = a) scores 1.
    """
    den = norm64(ga) * norm64(gb)
    num = dot64(ga, gb.conj())
    out = torch.where(den > 0, num / den.where(den > 0, 1.0), torch.full_like(num, complex(NAN, NAN)))
    return out.to(torch.promote_types(ga.dtype, gb.dtype))
