"""Sums over a state or Jacobian dimension, accumulated in float64 whatever the tensors' dtype.

A float32 sum over D terms drifts by about √D·ε₃₂ relative to the true value, and a ratio of two such
sums (a score) by as much: at D = 46,080 a float32 Frobenius score of A with itself came out 1.0047.
Every norm, dot product and ratio that reduces over a state or Jacobian dimension goes through these
helpers, which accumulate in float64 (complex128 for complex tensors) and never hold a float64 copy of
a whole operand: norms use ``torch.linalg.vector_norm(dtype=…)`` (fused, no copy), and dot products
upcast one slice of the last dimension at a time (at most :data:`CHUNK` elements per operand).
Results are float64 (complex128).
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK = 1 << 22  # elements of each operand upcast at once (32 MiB of float64)


def wide(x: Tensor) -> torch.dtype:
    """The accumulation dtype of ``x``: complex128 for complex tensors, else float64."""
    return torch.complex128 if x.is_complex() else torch.float64


def norm64(x: Tensor, dim: int | tuple[int, ...] = -1) -> Tensor:
    """Euclidean norm over ``dim`` accumulated in float64: (...) float64 (complex input: its modulus)."""
    if x.is_complex():
        return torch.linalg.vector_norm(torch.view_as_real(x), dim=_shift(dim, x.dim()) + (-1,), dtype=torch.float64)
    return torch.linalg.vector_norm(x, dim=dim, dtype=torch.float64)


def fro64(x: Tensor) -> Tensor:
    """Frobenius norm of each matrix of x (..., m, n), accumulated in float64: (...) float64."""
    return norm64(x, (-2, -1))


def _shift(dim: int | tuple[int, ...], ndim: int) -> tuple[int, ...]:
    """``dim`` as negative indices of a tensor of ``ndim`` dims, for the real view's extra last dim."""
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple((d % ndim) - ndim - 1 for d in dims)


def dot64(a: Tensor, b: Tensor, dim: int | tuple[int, ...] = -1) -> Tensor:
    """Σ a·b over ``dim`` (which must include the last dimension; a, b broadcast), accumulated in float64
    (complex128 where either is complex; conjugate b beforehand for a Hermitian product)."""
    dims = tuple(sorted(d % max(a.dim(), b.dim()) for d in ((dim,) if isinstance(dim, int) else dim)))
    last = max(a.dim(), b.dim()) - 1
    assert last in dims, "dot64 reduces over the last dimension (and possibly others)"
    dtype = torch.complex128 if a.is_complex() or b.is_complex() else torch.float64
    n = max(a.shape[-1], b.shape[-1])
    rows = max(a.numel() // max(a.shape[-1], 1), b.numel() // max(b.shape[-1], 1), 1)
    step = max(1, CHUNK // rows)
    total = None
    for start in range(0, n, step):
        part = (a[..., start:start + step].to(dtype) * b[..., start:start + step].to(dtype)).sum(dims)
        total = part if total is None else total + part
    if total is None:  # an empty last dimension
        return (a[..., :0].to(dtype) * b[..., :0].to(dtype)).sum(dims)
    return total


def gram64(g: Tensor) -> Tensor:
    """g·gᵀ of each matrix of g (..., m, n), accumulated in float64 over n, one column slice at a time:
    (..., m, m) float64."""
    m = g.shape[-2]
    rows = max(g.numel() // max(g.shape[-1], 1), 1)
    step = max(1, CHUNK // rows)
    out = g.new_zeros((*g.shape[:-1], m), dtype=torch.float64)
    for start in range(0, g.shape[-1], step):
        part = g[..., start:start + step].double()
        out += part @ part.mT
    return out


SQUARES_BLOCK = 1 << 12  # entries per float32 sum of squares in sumsq_blocks (its error ~ε₃₂, never growing with n)


def sumsq_blocks(x: Tensor) -> Tensor:
    """Σ x² over the last dimension, (...) float64: each block of :data:`SQUARES_BLOCK` entries summed in
    x's own dtype (one vectorised pass, no float64 copy: 13× faster than a float64 norm for 16 rows of
    mamba2-130m's 4.8 M-entry state), the blocks added in float64. Relative error ~ε of x's dtype."""
    if x.dtype == torch.float64 or x.is_complex():
        return norm64(x).square()
    n = x.shape[-1]
    full = n - n % SQUARES_BLOCK
    out = torch.linalg.vector_norm(x[..., :full].unflatten(-1, (-1, SQUARES_BLOCK)), dim=-1).double().square().sum(-1)
    if full < n:
        out = out + torch.linalg.vector_norm(x[..., full:], dim=-1).double().square()
    return out


BLOCK = 256  # columns per float32 product in gram_blocks: its error ~√BLOCK·ε₃₂, the blocks added in float64


def gram_blocks(g: Tensor) -> Tensor:
    """g·gᵀ of each matrix of g (..., m, n) as a float64 sum over blocks of :data:`BLOCK` columns, each block's
    product in g's own dtype (BLAS speed: the flow's spectral norm at S4D's D = 8,192 took 2.3× longer with
    every product in float64). Relative error ~√BLOCK·ε of g's dtype (float32: ~1e-6 and below), never
    growing with n: (..., m, m) float64."""
    if g.dtype in (torch.float64, torch.complex128):
        return gram64(g)
    out = g.new_zeros((*g.shape[:-1], g.shape[-2]), dtype=torch.float64)
    for start in range(0, g.shape[-1], BLOCK):
        part = g[..., start:start + BLOCK]
        out += (part @ part.mT).double()
    return out
