"""Matrix-free dynamics: the (t, T) grid, step singular values and ‖J_t‖_F from
Jacobian–vector products through ``core.step``, never a D × D matrix, each with an error bar.

- :func:`grid_hutchinson`: ‖∂z_T/∂z_t‖_F² = E‖P v‖² for v ~ N(0, I) (Hutchinson). ``probes`` vectors per
  start t are pushed forward through J_{t+1}, …, J_T together (one batched JVP per step for every
  running start), O(T·probes) JVPs per sequence instead of T²/2 products of D × D matrices. The
  estimate is sqrt(mean ‖Pv‖²) and its standard error the delta method's, se(F²)/(2F), with se(F²) the
  sample standard deviation of ‖Pv‖² over sqrt(probes). ±2 SE is the nominal 95% interval (a normal
  approximation; tested for coverage against the exact grid on GRU, S4D and Mamba cores).
- :func:`step_fro_hutchinson`: the same for one step, ‖J_t‖_F (the one gate term of a core without
  its own ``gate_terms``).
- :func:`step_top_singular`: the top k singular values of each J_t by block subspace iteration on
  J_tᵀJ_t (a JVP and a VJP per iteration), with the Ritz residual bound: an eigenvalue of JᵀJ lies
  within ‖JᵀJ v − θ v‖ of each Ritz value θ (symmetric matrices), so σ within that over σ (|σ² − θ| = |σ − √θ|·(σ + √θ)). The
  stored error is that bound: deterministic, not a standard error.

Memory: O(B·T·probes·D) for the grid's pushed vectors (T × D per probe, not D × D), O(B·k·D) for the
singular values. Every function takes an explicit ``torch.Generator``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from gradscope.analysis.cost import VJP_CHUNK
from gradscope.analysis.jacobian import state_readout
from gradscope.analysis.reduce import sumsq_blocks
from gradscope.analysis.tape import StateTape, state_at
from gradscope.errors import GradscopeError
from gradscope.models.core import own_products, span_cotangents, step_at, step_cotangents, step_tangents

PROBES = 16  # Hutchinson vectors per value: se/value ≈ sqrt(2/probes) for a rank-one-dominated matrix
ITERATIONS = 30  # subspace iterations for the top singular values
FLOW_SPAN = 64  # steps a core with its own span_cotangents pulls back at once (its memory: one layer's states a step)
OVERSAMPLE = 8  # extra subspace vectors beyond the k kept


def _repeat(x: Tensor, z: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """Each sequence's input and state repeated m times, as a batch of B·m (columns ride in the batch:
    one forward-mode pass at batch B·m, no vmap, which falls back to a loop on some cores' ops)."""
    return x.repeat_interleave(m, dim=0), z.repeat_interleave(m, dim=0)


def _chunked(fn, x: Tensor, z: Tensor, V: Tensor) -> Tensor:  # noqa: ANN001 - fn(x, z, V) → (B, m, D)
    """fn over row blocks of at most :data:`~gradscope.analysis.cost.VJP_CHUNK` numbers (B·m·D): a reverse pass at real size slows 5×
    past ~8 rows of a mamba-130m state (1.49 s for 16 rows, 0.29 s for 8; measured on this workplace's
    CPU), so rows go 8 at a time there; small models run in one go, so their numbers do not change."""
    B, m, D = V.shape
    per = max(1, VJP_CHUNK // max(1, B * D))
    if m <= per:
        return fn(x, z, V)
    return torch.cat([fn(x, z, V[:, i:i + per]) for i in range(0, m, per)], dim=1)


def _jvp_columns(core: nn.Module, x: Tensor, z: Tensor, V: Tensor, t: int) -> Tensor:
    """J_t V for V (B, m, D) column blocks: (B, m, D), through ``torch.func.jvp`` (or the core's own
    ``step_jvp``, else its ``step_tangents``), J_t never formed. (Forward mode has no slowdown past a few columns: one call.)"""
    own = getattr(core, "step_jvp", None)
    if callable(own):
        out = own(x, z, V.mT, t=t) if getattr(core, "position_dependent", False) else own(x, z, V.mT)
        return out.mT
    if "jvp" in own_products(core):  # a core's hand-derived forward mode, all columns at once
        return step_tangents(core, x, z, V.transpose(0, 1).contiguous(), t)[3].transpose(0, 1)
    B, m, D = V.shape
    xr, zr = _repeat(x, z, m)
    out = torch.func.jvp(lambda s: step_at(core, xr, s, t)[1], (zr,), (V.reshape(B * m, D),))[1]
    return out.reshape(B, m, D)


def _vjp_rows(core: nn.Module, x: Tensor, z: Tensor, U: Tensor, t: int) -> Tensor:
    """U J_t for U (B, m, D): (B, m, D), from the core's own ``step_cotangents`` where it has one (all rows
    at once), else by ``torch.func`` reverse mode in chunks of rows (:func:`_chunked`)."""
    if "vjp" in own_products(core):
        return step_cotangents(core, x, z, U.transpose(0, 1).contiguous(), t).transpose(0, 1)
    return _chunked(lambda xc, zc, Uc: _vjp_block(core, xc, zc, Uc, t), x, z, U)


def _vjp_block(core: nn.Module, x: Tensor, z: Tensor, U: Tensor, t: int) -> Tensor:
    B, m, D = U.shape
    xr, zr = _repeat(x, z, m)
    _, pullback = torch.func.vjp(lambda s: step_at(core, xr, s, t)[1], zr)
    return pullback(U.reshape(B * m, D))[0].reshape(B, m, D)


def _mean_se(samples: Tensor) -> tuple[Tensor, Tensor]:
    """(mean, standard error of the mean) over the last dimension."""
    m = samples.shape[-1]
    return samples.mean(-1), samples.std(-1, correction=1) / math.sqrt(m)


def _fro_from_squares(sq: Tensor) -> tuple[Tensor, Tensor]:
    """sqrt of the mean of ‖Pv‖² samples and its delta-method standard error."""
    mean, se = _mean_se(sq)
    fro = mean.clamp_min(0).sqrt()
    return fro, se / (2 * fro.clamp_min(torch.finfo(fro.dtype).tiny))


def grid_hutchinson(core: nn.Module, x: Tensor, prev: Tensor | StateTape, *, probes: int = PROBES,
                    generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Estimated ‖∂z_T/∂z_t‖_F for 1 ≤ t ≤ T (the layout of :func:`gradscope.analysis.dynamics.tT_grid`):
    x (B, T, in) inputs, prev (B, T, D) the states before each step. Returns (grid (B, T, T), se (B, T, T)):
    the diagonal is sqrt(D) exactly (se 0), t > T is NaN."""
    B, T, _ = x.shape
    D = core.state_dim
    grid = x.new_full((B, T, T), math.nan)
    se = x.new_full((B, T, T), math.nan)
    grid.diagonal(dim1=1, dim2=2).fill_(math.sqrt(D))
    se.diagonal(dim1=1, dim2=2).fill_(0.0)
    V = None  # (B, running starts, probes, D): P_{t→end} v for every start t < end
    for end in range(2, T + 1):
        fresh = torch.randn(B, 1, probes, D, generator=generator, dtype=torch.float64).to(x.dtype).to(x.device)
        V = fresh if V is None else torch.cat([V, fresh], dim=1)
        n = V.shape[1]
        out = _jvp_columns(core, x[:, end - 1], state_at(prev, end - 1), V.reshape(B, n * probes, D), end - 1)
        V = out.reshape(B, n, probes, D)
        fro, err = _fro_from_squares(sumsq_blocks(V))
        grid[:, :end - 1, end - 1], se[:, :end - 1, end - 1] = fro, err
    return grid, se


def step_fro_hutchinson(core: nn.Module, x: Tensor, prev: Tensor | StateTape, *, probes: int = PROBES,
                        generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Estimated ‖J_t‖_F of every step: x (B, T, in), prev (B, T, D) → (fro (B, T), se (B, T))."""
    B, T, _ = x.shape
    D = core.state_dim
    fro, se = x.new_empty(B, T), x.new_empty(B, T)
    for t in range(T):
        V = torch.randn(B, probes, D, generator=generator, dtype=torch.float64).to(x.dtype).to(x.device)
        fro[:, t], se[:, t] = _fro_from_squares(sumsq_blocks(_jvp_columns(core, x[:, t], state_at(prev, t), V, t)))
    return fro, se


def step_top_singular(core: nn.Module, x: Tensor, prev: Tensor | StateTape, k: int, *, iterations: int = ITERATIONS,
                      generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Top k singular values of every J_t by subspace iteration on JᵀJ: x (B, T, in), prev (B, T, D) →
    (values (B, T, k) descending, bound (B, T, k)): each value lies within ``bound`` of a singular value
    of J_t (the Ritz residual bound, module docstring)."""
    B, T, _ = x.shape
    D = core.state_dim
    k = min(k, D)
    width = min(D, k + OVERSAMPLE)  # a few more vectors than kept: the kth converges at σ_{width+1}/σ_k
    values, bound = x.new_empty(B, T, k), x.new_empty(B, T, k)
    for t in range(T):
        xt, zt = x[:, t], state_at(prev, t)
        Q = torch.linalg.qr(torch.randn(B, D, width, generator=generator, dtype=torch.float64).to(x.dtype))[0].mT
        for _ in range(iterations):  # Q (B, k, D) rows: an orthonormal basis of the current subspace
            W = _vjp_rows(core, xt, zt, _jvp_columns(core, xt, zt, Q, t), t)  # rows of (JᵀJ Q)ᵀ
            Q = torch.linalg.qr(W.mT)[0].mT
        JQ = _jvp_columns(core, xt, zt, Q, t)
        W = _vjp_rows(core, xt, zt, JQ, t)  # (B, k, D): rows of JᵀJ Q
        H = Q @ W.mT  # (B, k, k) Rayleigh quotient
        theta, S = torch.linalg.eigh((H + H.mT) / 2)
        theta, S = theta.flip(-1), S.flip(-1)
        ritz = S.mT @ Q  # (B, k, D) Ritz vectors
        resid = torch.linalg.vector_norm(S.mT @ W - theta[..., None] * ritz, dim=-1)
        sigma = theta.clamp_min(0).sqrt()
        values[:, t] = sigma[:, :k]
        bound[:, t] = torch.where(sigma > 0, resid / sigma.clamp_min(torch.finfo(sigma.dtype).tiny), resid.sqrt())[:, :k]
    return values, bound


def flow_hutchinson(core: nn.Module, x: Tensor, prev: Tensor | StateTape, *, probes: int = PROBES,
                    generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Estimated ‖∂y_T/∂z_k‖_F for k = 1 … T (the layout of :func:`gradscope.analysis.dynamics.gradient_flow`'s
    Frobenius norm): x (B, T, in), prev the states before each step ((B, T, D) or a
    :class:`~gradscope.analysis.tape.StateTape`). Returns (fro (B, T), se (B, T)).

    ‖G_k‖_F² = E‖uᵀ G_k‖² for u ~ N(0, I_H) (Hutchinson on G_k G_kᵀ). The ``probes`` rows uᵀ ∂y_T/∂z_T
    are pulled back through J_T, …, J_2 together, one batched VJP per step, so every k comes from the
    one reverse chain: O(T·probes) VJPs a sequence, memory probes × D, never H × D. Column T needs the
    core's ``readout(x, z)``; without one it is NaN and the chain starts from ∂y_T/∂z_{T−1}, as the
    exact flow does. When H <= probes the H rows of the identity are pulled back instead: exact, error 0.
    The spectral norm is not estimated (it needs products with G_k, a forward chain
    from every k)."""
    B, T, _ = x.shape
    H = core.out_dim
    fro, se = x.new_full((B, T), math.nan), x.new_full((B, T), math.nan)
    exact = H <= probes  # as cheap exactly: the H rows of the identity, ‖G_k‖_F² = Σ_i ‖e_iᵀ G_k‖², error 0
    if exact:
        probes = H
        U = torch.eye(H, dtype=x.dtype, device=x.device).expand(B, H, H)
    else:
        U = torch.randn(B, probes, H, generator=generator, dtype=torch.float64).to(x.dtype).to(x.device)

    def norms(R: Tensor) -> tuple[Tensor, Tensor]:
        return from_squares(sumsq_blocks(R))  # float64 sums over the state

    def from_squares(sq: Tensor) -> tuple[Tensor, Tensor]:  # (B, probes) squared norms
        if exact:
            fro = sq.sum(-1).sqrt()
            return fro, torch.zeros_like(fro)
        return _fro_from_squares(sq)

    xr, zr = _repeat(x[:, T - 1], state_at(prev, T - 1), probes)

    def pull(fn, at: Tensor) -> Tensor:  # noqa: ANN001 - U · ∂fn/∂at, rows batched as B·probes
        _, pullback = torch.func.vjp(fn, at)
        return pullback(U.reshape(B * probes, H))[0].reshape(B, probes, -1)

    try:
        z_T = step_at(core, xr, zr, T - 1)[1]
        R = pull(lambda z: state_readout(core, xr, z), z_T)  # rows of uᵀ ∂y_T/∂z_T
        first = T
    except GradscopeError:
        if T == 1:
            return fro, se
        R = pull(lambda z: step_at(core, xr, z, T - 1)[0], zr)  # uᵀ ∂y_T/∂z_{T−1}
        first = T - 1
    fro[:, first - 1], se[:, first - 1] = norms(R)
    if "span" in own_products(core):  # the core pulls a span of steps back at once, with each step's norms
        rows, end = R.transpose(0, 1).contiguous(), first  # (probes, B, D) on z_end
        while end > 1:
            start = max(1, end - FLOW_SPAN)  # steps reading x[:, start:end], from z_start
            rows, sq = span_cotangents(core, x[:, start:end], state_at(prev, start), rows, sumsq_blocks, start)
            for q in range(end - start):  # sq[..., q]: the rows on z_{start+q}, column start+q−1
                fro[:, start + q - 1], se[:, start + q - 1] = from_squares(sq[..., q].transpose(0, 1))
            end = start
        return fro, se
    for k in range(first - 1, 0, -1):  # R ← R · J_{k+1}: step k+1 reads x[:, k] at z_k
        R = _vjp_rows(core, x[:, k], state_at(prev, k), R, k)
        fro[:, k - 1], se[:, k - 1] = norms(R)
    return fro, se
