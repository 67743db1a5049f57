"""State Jacobians J = ∂y_T/∂z_p of a sequence core (docs/definitions.md §4).

For one sequence of T tokens and a target position p (1-based), z_p is the full real state right
after step p is read (``zs[:, p-1]`` of :meth:`Core.scan`) and y_T is the core's output at the last
step; steps p+1 … T run with their input vectors held fixed. J has D_out = H rows and D columns.

Engines (``METHODS``; ``"auto"`` picks ``"analytic"`` where it applies, else ``"vjp"``):

- ``func``: ``vmap`` over sequences of ``jacrev`` of a function that rolls ``core.step`` from p+1 to T.
  Portable reference; real → real (torch.func rejects complex in/outputs, complex intermediates are fine).
- ``vjp``: reverse chaining with ``torch.func.vjp`` of one ``core.step`` per time step, vmapped over
  the H cotangent rows. Works for any core; it is what ``auto`` uses for multi-block S4D.
- ``analytic``: the same reverse chaining, with the per-step Jacobians formed elementwise from the
  gate activations and applied with batched matmuls (Elman, GRU, LSTM, any number of layers), or in
  closed form (single-block S4D, whose state transition is diagonal and input-independent).

Why chain from the output side: J = R_T · J_T · J_{T−1} ⋯ J_{p+1} with R_T = ∂y_T/∂z_T (H × D) and
J_t = ∂z_t/∂z_{t−1} (D × D). Multiplying left to right keeps only H rows, so each step costs
H·D·D flops instead of D³ for products of full Jacobians. Per step and sequence (one layer):
Elman H³ (J_t = diag(1 − h_t²) W_hh: scale the rows' columns, one shared GEMM); GRU H³
(J_t = diag(u) + Σ_gates diag(c_k) W_hk, formed in O(H²), one ``bmm``) where ``jacrev`` pays 3H³
(its cotangent meets the stacked 3H × H W_hh); LSTM 2H³ where ``jacrev`` pays 4H³: the state
(h, c) is 2H wide, but ∂c'/∂c and ∂h'/∂c are diagonal, so a step is one (H × 2H)·(2H × H) ``bmm``.
On CPU both run at BLAS speed, so these flop ratios (3×, 2×) bound the gain over ``func`` there,
less its dispatch overhead. Single-block S4D: ∂x_T/∂x_p = dA^(T−p) is diagonal (a 2 × 2
rotation-scaling per mode on the real view), so J[i, (h, n)] = R_T[i, h] · (2a, −2b) with
C_n dA_n^(T−p) = a + ib, and R_T holds the D-skip, GELU' and GLU: the cost is writing J out.

Memory: sequences are processed ``chunk`` at a time. Per chunk the working set is the scanned
states (chunk · T · D) plus O(chunk · H · D) for the chain. The returned J itself is B · H · D
numbers: 1 GiB for a float32 paper-size GRU (H = 512) over 1024 sequences, 2 GiB for the LSTM, but
64 GiB for paper-size S4D (D = H·N = 32768): consume large S4D batches chunk by chunk with
:func:`iter_state_jacobian` and a small ``chunk``.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import Tensor, nn
from torch.func import jacrev, jvp, vjp, vmap

from gradscope.fields import ENGINES, JACOBIAN_CHUNK, JACOBIAN_METHOD
from gradscope.errors import GradscopeError, check
from gradscope.models.core import chain_tangents, initial_state, scan, step_at

PRODUCT_CHUNK = 8  # sequences whose matrix-free products (jvp_products, vjp_products) run at once


@dataclass(frozen=True)
class JacobianResult:
    """J = ∂y_T/∂z_p per sequence: ``jac`` (B, D_out, D), ``output`` y_T (B, D_out), ``state`` z_p
    (B, D), all in the model's dtype; ``method`` names the engine that produced ``jac``."""

    jac: Tensor
    output: Tensor
    state: Tensor
    method: str


def state_readout(core: nn.Module, x: Tensor, z: Tensor) -> Tensor:
    """y_t from the state z_t right after step t and that step's input x_t: (B, in), (B, D) → (B, H)."""
    try:
        return core.readout(x, z)
    except (AttributeError, NotImplementedError):
        raise GradscopeError(f"position: p = T needs a readout from the state (a readout(x, z) method), which "
                             f"{type(core).__name__} does not provide; use a position p < T") from None


# ---------------------------------------------------------------------------------------------
# Generic engines: torch.func through core.step

def _func_engine(core: nn.Module, x: Tensor, zs: Tensor, p: int) -> Tensor:
    """vmap over sequences of jacrev of z_p ↦ y_T. x (B, T, in), zs (B, T, D) → (B, H, D)."""
    T = x.shape[1]

    def f(z: Tensor, steps: Tensor, last: Tensor) -> Tensor:  # (D,), (T−p, in), (in,) → (H,)
        zb, y = z[None], None
        for t in range(steps.shape[0]):
            y, zb = step_at(core, steps[t][None], zb, p + t)
        return state_readout(core, last[None], zb)[0] if y is None else y[0]

    return vmap(jacrev(f))(zs[:, p - 1], x[:, p:], x[:, T - 1])


def rows_vjp(fn: Callable[[Tensor], Tensor], primal: Tensor, rows: Tensor) -> Tensor:
    """Row-batched VJP: rows (B, R, out) of cotangents → rows · ∂fn/∂primal (B, R, D)."""
    _, pullback = vjp(fn, primal)
    return vmap(lambda c: pullback(c)[0], in_dims=1, out_dims=1)(rows)


def _vjp_chain(core: nn.Module, x: Tensor, zs: Tensor, p: int, rows: Tensor) -> Tensor:
    """rows (B, R, H) of cotangents on y_T → rows · ∂y_T/∂z_p (B, R, D), chained backwards one step
    at a time with torch.func.vjp."""
    T = x.shape[1]
    if p == T:
        return rows_vjp(lambda z: state_readout(core, x[:, T - 1], z), zs[:, T - 1], rows)
    G = rows_vjp(lambda z: step_at(core, x[:, T - 1], z, T - 1)[0], zs[:, T - 2], rows)  # ∂y_T/∂z_{T−1}
    for t in range(T - 2, p - 1, -1):  # 0-based step t maps zs[:, t−1] to zs[:, t]
        G = rows_vjp(lambda z: step_at(core, x[:, t], z, t)[1], zs[:, t - 1], G)
    return G


def _vjp_engine(core: nn.Module, x: Tensor, zs: Tensor, p: int) -> Tensor:
    """Reverse chaining with torch.func.vjp of one step at a time. → (B, H, D)."""
    eye = torch.eye(core.out_dim, dtype=x.dtype, device=x.device).expand(x.shape[0], -1, -1)
    return _vjp_chain(core, x, zs, p, eye)


def _jvp_chain(core: nn.Module, x: Tensor, z_p: Tensor, p: int, tangents: Tensor) -> tuple[Tensor, Tensor]:
    """Forward chaining from z_p (B, D) with tangents (B, m, D): (y_T (B, H), ∂y_T/∂z_p · tangents
    (B, H, m)). Steps p+1 … T run once for the primal and batched for the m tangents
    (:func:`gradscope.models.core.chain_tangents`: the core's own hand-derived products where it has them,
    else ``vmap`` of ``torch.func.jvp``), so the cost is about (1 + m) forward passes of the tail and
    nothing of size H × D is formed."""
    T = x.shape[1]
    if p == T:
        return vmap(lambda v: jvp(lambda a: state_readout(core, x[:, T - 1], a), (z_p,), (v,)),
                    in_dims=1, out_dims=(None, 2))(tangents)
    y, dy = chain_tangents(core, x[:, p:], z_p, tangents.movedim(1, 0).contiguous(), p)  # dy (m, B, H)
    return y, dy.permute(1, 2, 0)


# ---------------------------------------------------------------------------------------------
# Analytic engine: the core's own hand-derived chain or closed form (see its file)

def analytic_unsupported(core: nn.Module) -> str | None:
    """Why the analytic engine cannot handle ``core`` (None when it can)."""
    probe = getattr(core, "analytic_unsupported", None)
    return probe() if callable(probe) else f"{type(core).__name__} provides no analytic_jacobian"


def _analytic_engine(core: nn.Module, x: Tensor, zs: Tensor, p: int) -> Tensor:
    """Elementwise per-step Jacobians chained with bmm (RNN cores) or a closed form (S4D). → (B, H, D)."""
    return core.analytic_jacobian(x, zs, p)


Engine = Callable[[nn.Module, Tensor, Tensor, int], Tensor]
METHODS: dict[str, Engine] = dict(zip(ENGINES, (_func_engine, _vjp_engine, _analytic_engine)))  # by name, as declared


# ---------------------------------------------------------------------------------------------
# Public API

def resolve_method(core: nn.Module, method: str) -> str:
    """The engine name that ``method`` ("auto" or a key of METHODS) means for ``core``."""
    check(method == "auto" or method in METHODS,
          f"method: got {method!r}; valid values are auto, {', '.join(METHODS)}")
    reason = analytic_unsupported(core)
    if method == "auto":
        return "vjp" if reason else "analytic"
    check(method != "analytic" or reason is None,
          f"method: 'analytic' cannot be used here: {reason}; use 'vjp' or 'auto'")
    return method


def _checked(model: nn.Module, tokens: Tensor, position: int, chunk: int) -> int:
    """The checks every public entry point makes on its arguments; returns the position as an int."""
    floats = isinstance(tokens, Tensor) and tokens.is_floating_point()
    check(isinstance(tokens, Tensor) and tokens.dim() == (3 if floats else 2) and not tokens.is_complex(),
          f"tokens: expected integer token ids (B, T), or float input vectors (B, T, in) for a model that "
          f"reads them directly; got {tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__}")
    check(tokens.shape[0] >= 1, "tokens: got 0 sequences; need at least one")
    T = tokens.shape[1]
    try:
        position = operator.index(position)
    except TypeError:
        raise GradscopeError(f"position: got {position!r}; it must be an integer in [1, {T}]") from None
    check(1 <= position <= T,
          f"position: got {position}; it must lie in [1, {T}] (1-based, T = {T} steps per sequence)")
    check(isinstance(chunk, int) and chunk >= 1, f"chunk: got {chunk}; it must be a positive integer")
    check(hasattr(model, "core") and hasattr(model, "core_inputs"),
          f"model: expected a gradscope model (gradscope.load(...).model or gradscope.wrap(...)); got "
          f"{type(model).__name__}, which has no core/core_inputs (wrap it with gradscope.wrap)")
    return position


def iter_state_jacobian(model: nn.Module, tokens: Tensor, position: int, *, method: str = JACOBIAN_METHOD,
                        chunk: int = JACOBIAN_CHUNK) -> Iterator[tuple[slice, JacobianResult]]:
    """:func:`state_jacobian` chunk by chunk: yields (rows of ``tokens``, result for those rows), each
    result holding ``jac`` (b, H, D), ``output`` (b, H), ``state`` (b, D) for b ≤ ``chunk`` sequences."""
    position = _checked(model, tokens, position, chunk)
    T = tokens.shape[1]
    core = model.core
    name = resolve_method(core, method)
    engine = METHODS[name]
    tokens = tokens.to(next(model.parameters()).device)
    for start in range(0, tokens.shape[0], chunk):
        rows = slice(start, min(start + chunk, tokens.shape[0]))
        # no_grad per chunk, never across the yield: grad mode is thread-local, and a generator suspended
        # (or finalised later, on another thread) inside no_grad would leave its caller without gradients
        with torch.no_grad():  # torch.func transforms still differentiate; nothing else builds a graph
            x = model.core_inputs(tokens[rows])  # (b, T, in), held fixed
            ys, zs = scan(core, x)  # (b, T, H), (b, T, D)
            jac = engine(core, x, zs, position)
            # clone: views would keep the whole (b, T, D) scan alive
            result = JacobianResult(jac=jac, output=ys[:, T - 1].clone(), state=zs[:, position - 1].clone(),
                                    method=name)
        yield rows, result


def state_jacobian(model: nn.Module, tokens: Tensor, position: int, *, method: str = JACOBIAN_METHOD,
                   chunk: int = JACOBIAN_CHUNK) -> JacobianResult:
    """J = ∂y_T/∂z_p for every sequence, steps p+1 … T run with their inputs held fixed.

    model: a :class:`~gradscope.models.seq.SeqModel` or a model from :func:`gradscope.wrap` (any
    dtype; everything runs in it): anything with a protocol ``core`` and ``core_inputs``.
    tokens: (B, T) token ids, or (B, T, in) float inputs for a wrapped model without an input map;
    T = total length (input and output phase). position: p, 1-based, in [1, T]: z_p is the full
    state right after input p is read.
    method: "auto" (analytic where available, else vjp) or a key of ``METHODS``.
    chunk: sequences processed at once (bounds the working memory).
    Returns ``jac`` (B, H, D), ``output`` y_T (B, H), ``state`` z_p (B, D).
    """
    parts = iter_state_jacobian(model, tokens, position, method=method, chunk=chunk)
    rows, first = next(parts)
    if rows.stop == tokens.shape[0]:  # one chunk: no copy (J can be most of the memory in use)
        parts.close()  # finalise now, on this thread (it holds the chunk's scan until then)
        return first
    jac = first.jac.new_empty(tokens.shape[0], *first.jac.shape[1:])
    output = first.output.new_empty(tokens.shape[0], *first.output.shape[1:])
    state = first.state.new_empty(tokens.shape[0], *first.state.shape[1:])
    for rows, part in itertools.chain([(rows, first)], parts):
        jac[rows], output[rows], state[rows] = part.jac, part.output, part.state
    return JacobianResult(jac=jac, output=output, state=state, method=first.method)


def wirtinger_view(jac: Tensor, model: nn.Module) -> Tensor:
    """Conjugate-Wirtinger view of a Jacobian on a complex state: J_c = ½(∂/∂Re x + i ∂/∂Im x).

    jac (..., D) on the real view (re/im pairs adjacent) → complex (..., D/2), one column per mode.
    """
    check(getattr(model.core, "complex_state", False),
          f"model: the Wirtinger view needs a core with a complex state; got {type(model.core).__name__}")
    return 0.5 * torch.complex(jac[..., 0::2], jac[..., 1::2])


def _products(model: nn.Module, tokens: Tensor, position: int, vectors: Tensor, width: int, what: str,
              chunk: int) -> tuple[int, Tensor]:
    position = _checked(model, tokens, position, chunk)
    check(isinstance(vectors, Tensor) and vectors.dim() == 3 and vectors.shape[0] == tokens.shape[0]
          and vectors.shape[2] == width and vectors.is_floating_point(),
          f"{what}: expected a float tensor (B = {tokens.shape[0]}, k, {width}); got "
          f"{tuple(vectors.shape) if isinstance(vectors, Tensor) else type(vectors).__name__}")
    return position, tokens.to(next(model.parameters()).device)


def jvp_products(model: nn.Module, tokens: Tensor, position: int, tangents: Tensor, *,
                 chunk: int = PRODUCT_CHUNK) -> tuple[Tensor, Tensor]:
    """J · V without forming J = ∂y_T/∂z_p: tangents V (B, m, D) on z_p → (y_T (B, H), J V (B, H, m)).

    Matrix-free: steps p+1 … T run forward once with m tangents (forward-mode, ``torch.func.jvp``
    batched by ``vmap``), about (1 + m) forward passes of the tail; memory O(chunk · m · D) for the
    tangents, never B · H · D or T · D. ``chunk`` sequences at a time. Each column of V gives all H
    rows of J v at once, which is what a column sketch of J needs (:mod:`gradscope.analysis.sketch`).
    """
    position, tokens = _products(model, tokens, position, tangents, model.core.state_dim, "tangents", chunk)
    core, ys, out = model.core, [], []
    for start in range(0, tokens.shape[0], chunk):
        rows = slice(start, start + chunk)
        with torch.no_grad():
            x = model.core_inputs(tokens[rows])  # (b, T, in)
            z = initial_state(core, x.shape[0], x)
            for t in range(position):  # the head: z_p
                z = step_at(core, x[:, t], z, t)[1]
            y, jv = _jvp_chain(core, x, z, position, tangents[rows].to(z))
        ys.append(y)
        out.append(jv)
    return torch.cat(ys), torch.cat(out)


def vjp_products(model: nn.Module, tokens: Tensor, position: int, cotangents: Tensor, *,
                 chunk: int = PRODUCT_CHUNK) -> tuple[Tensor, Tensor]:
    """U · J without forming J = ∂y_T/∂z_p: cotangents U (B, r, H) on y_T → (y_T (B, H), U J (B, r, D)).

    Matrix-free: one forward scan, then r rows chained backwards through steps T … p+1 (reverse mode,
    ``torch.func.vjp`` batched by ``vmap``); memory O(chunk · (T + r) · D), never B · H · D. With U
    the identity rows in chunks this computes J exactly, r rows at a time."""
    position, tokens = _products(model, tokens, position, cotangents, model.core.out_dim, "cotangents", chunk)
    core, ys, out = model.core, [], []
    for start in range(0, tokens.shape[0], chunk):
        rows = slice(start, start + chunk)
        with torch.no_grad():
            x = model.core_inputs(tokens[rows])
            y, zs = scan(core, x)
            out.append(_vjp_chain(core, x, zs, position, cotangents[rows].to(zs)))
        ys.append(y[:, -1].clone())
    return torch.cat(ys), torch.cat(out)
