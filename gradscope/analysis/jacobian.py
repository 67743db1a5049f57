"""State Jacobians J = ∂y_T/∂z_p of a sequence core (SPEC §4).

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
import math
import operator
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import Tensor, nn
from torch.func import jacrev, vjp, vmap

from gradscope.errors import GradscopeError, check
from gradscope.models.core import Core
from gradscope.models.rnn import CELLS, RNNCore
from gradscope.models.s4d import S4DBlock, S4DCore


@dataclass(frozen=True)
class JacobianResult:
    """J = ∂y_T/∂z_p per sequence: ``jac`` (B, D_out, D), ``output`` y_T (B, D_out), ``state`` z_p
    (B, D), all in the model's dtype; ``method`` names the engine that produced ``jac``."""

    jac: Tensor
    output: Tensor
    state: Tensor
    method: str


# ---------------------------------------------------------------------------------------------
# y_T as a function of the state z_T (needed for p = T, and as R_T by the analytic engine)

def _rnn_readout(core: RNNCore, x: Tensor, z: Tensor) -> Tensor:
    """The top layer's h. x (B, in) unused, z (B, D) → (B, H)."""
    top = (core.num_layers - 1) * core.layer_state
    return z[:, top:top + core.hidden_size]


def _s4d_readout(core: S4DCore, x: Tensor, z: Tensor) -> Tensor:
    """Every block's output from its state after the step. x (B, in), z (B, D) → (B, H)."""
    u = x @ core.in_proj.weight.T + core.in_proj.bias  # (B, H)
    for block, part in zip(core.ssm, z.split(core.block_state, dim=-1)):
        _, _, C = block.kernel.discrete()
        pair = part.reshape(-1, core.channels, core.modes, 2)
        state = torch.complex(pair[..., 0], pair[..., 1])  # (B, H, N/2)
        u = block.readout(2 * (C * state).real.sum(-1) + block.D * u)
    return u


READOUTS: dict[type[Core], Callable[..., Tensor]] = {RNNCore: _rnn_readout, S4DCore: _s4d_readout}


def state_readout(core: Core, x: Tensor, z: Tensor) -> Tensor:
    """y_t from the state z_t right after step t and that step's input x_t: (B, in), (B, D) → (B, H)."""
    for kind, fn in READOUTS.items():
        if isinstance(core, kind):
            return fn(core, x, z)
    raise GradscopeError(f"position: p = T needs a readout from the state, which {type(core).__name__} "
                         f"does not register (known cores: {', '.join(k.__name__ for k in READOUTS)})")


# ---------------------------------------------------------------------------------------------
# Generic engines: torch.func through core.step

def _func_engine(core: Core, x: Tensor, zs: Tensor, p: int) -> Tensor:
    """vmap over sequences of jacrev of z_p ↦ y_T. x (B, T, in), zs (B, T, D) → (B, H, D)."""
    T = x.shape[1]

    def f(z: Tensor, steps: Tensor, last: Tensor) -> Tensor:  # (D,), (T−p, in), (in,) → (H,)
        zb, y = z[None], None
        for t in range(steps.shape[0]):
            y, zb = core.step(steps[t][None], zb)
        return state_readout(core, last[None], zb)[0] if y is None else y[0]

    return vmap(jacrev(f))(zs[:, p - 1], x[:, p:], x[:, T - 1])


def _rows_vjp(fn: Callable[[Tensor], Tensor], primal: Tensor, rows: Tensor) -> Tensor:
    """Row-batched VJP: rows (B, R, out) of cotangents → rows · ∂fn/∂primal (B, R, D)."""
    _, pullback = vjp(fn, primal)
    return vmap(lambda c: pullback(c)[0], in_dims=1, out_dims=1)(rows)


def _vjp_engine(core: Core, x: Tensor, zs: Tensor, p: int) -> Tensor:
    """Reverse chaining with torch.func.vjp of one step at a time. → (B, H, D)."""
    B, T, _ = x.shape
    eye = torch.eye(core.out_dim, dtype=x.dtype, device=x.device).expand(B, -1, -1)
    if p == T:
        return _rows_vjp(lambda z: state_readout(core, x[:, T - 1], z), zs[:, T - 1], eye)
    G = _rows_vjp(lambda z: core.step(x[:, T - 1], z)[0], zs[:, T - 2], eye)  # ∂y_T/∂z_{T−1}
    for t in range(T - 2, p - 1, -1):  # 0-based step t maps zs[:, t−1] to zs[:, t]
        G = _rows_vjp(lambda z: core.step(x[:, t], z)[1], zs[:, t - 1], G)
    return G


# ---------------------------------------------------------------------------------------------
# Analytic engine, RNN cores. Each cell VJP takes the step's input x (B, in), old layer state
# s (B, S), weights, cotangent rows g (B, R, S) on the new layer state (a spent buffer it may
# overwrite) and ``out`` (B, R, S), where it writes the rows on s; it returns the rows on x
# (B, R, in) when asked (layers above the first), else None. Writing into preallocated buffers
# matters on CPU: a fresh multi-MB tensor per step (a torch.cat) measured at half a bmm's time,
# and in-place baddbmm_ into a strided view fell back to one addmm per sequence.

Weights = tuple[Tensor, Tensor, Tensor, Tensor]
CellVJP = Callable[[Tensor, Tensor, Weights, Tensor, Tensor, bool], "Tensor | None"]


def _scaled_rows(coef: Tensor, w: Tensor, out: Tensor | None = None) -> Tensor:
    """Σ_k diag(coef[:, k]) W_k: coef (B, K, H), w (K·H, n) → (B, H, n), formed elementwise."""
    blocks = w.view(coef.shape[1], coef.shape[2], -1)  # (K, H, n)
    out = torch.mul(coef[:, 0, :, None], blocks[0], out=out)
    for k in range(1, coef.shape[1]):
        out.addcmul_(coef[:, k, :, None], blocks[k])
    return out


def _elman_vjp(x: Tensor, h: Tensor, w: Weights, g: Tensor, out: Tensor, need_input: bool) -> Tensor | None:
    # J = diag(1 − h'²) W_hh: scaling the cotangent columns and one shared GEMM is cheapest.
    w_ih, w_hh, b_ih, b_hh = w
    h_new = torch.tanh(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh)  # (B, H)
    ga = g.mul_((1 - h_new * h_new)[:, None, :])  # (B, R, H)
    torch.matmul(ga, w_hh, out=out)
    return ga @ w_ih if need_input else None


def _gru_vjp(x: Tensor, h: Tensor, w: Weights, g: Tensor, out: Tensor, need_input: bool) -> Tensor | None:
    w_ih, w_hh, b_ih, b_hh = w
    i_r, i_u, i_n = (x @ w_ih.T + b_ih).chunk(3, dim=-1)
    h_r, h_u, h_n = (h @ w_hh.T + b_hh).chunk(3, dim=-1)
    r, u = torch.sigmoid(i_r + h_r), torch.sigmoid(i_u + h_u)
    n = torch.tanh(i_n + r * h_n)
    a_n = (1 - u) * (1 - n * n)  # ∂h'/∂(pre-activation of n)
    c_r, c_u = a_n * h_n * r * (1 - r), (h - n) * u * (1 - u)
    jac = _scaled_rows(torch.stack([c_r, c_u, a_n * r], dim=1), w_hh)  # (B, H, H)
    jac.diagonal(dim1=1, dim2=2).add_(u)  # ∂h'/∂h = diag(u) + Σ_k diag(c_k) W_hk
    torch.bmm(g, jac, out=out)
    return torch.bmm(g, _scaled_rows(torch.stack([c_r, c_u, a_n], dim=1), w_ih)) if need_input else None


def _lstm_vjp(x: Tensor, s: Tensor, w: Weights, g: Tensor, out: Tensor, need_input: bool) -> Tensor | None:
    w_ih, w_hh, b_ih, b_hh = w
    H = s.shape[-1] // 2
    h, c = s.chunk(2, dim=-1)
    i, f, cand, o = (x @ w_ih.T + b_ih + h @ w_hh.T + b_hh).chunk(4, dim=-1)
    i, f, cand, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(cand), torch.sigmoid(o)
    tc = torch.tanh(f * c + i * cand)
    g_h, g_c = g[..., :H], g[..., H:]  # (B, R, H) each
    g_c.addcmul_(g_h, (o * (1 - tc * tc))[:, None, :])  # now the total cotangent on c'
    torch.mul(g_c, f[:, None, :], out=out[..., H:])  # ∂c'/∂c = diag(f); ∂h'/∂c goes through c'
    # Rows on h: [g_h, g_c] · [∂h'/∂h|_o ; ∂c'/∂h], one (R × 2H)·(2H × H) bmm, with
    # ∂h'/∂h|_o = diag(tc·o(1−o)) W_ho and ∂c'/∂h = Σ_{i,f,g} diag(·) W_h·.
    coef = torch.stack([cand * i * (1 - i), c * f * (1 - f), i * (1 - cand * cand)], dim=1)  # (B, 3, H)
    c_o = (tc * o * (1 - o))[:, :, None]  # (B, H, 1)
    lhs = g.contiguous()

    def pull(w_: Tensor) -> Tensor:
        m = w_.new_empty(g.shape[0], 2 * H, w_.shape[1])  # (B, 2H, n)
        torch.mul(c_o, w_[3 * H:], out=m[:, :H])
        _scaled_rows(coef, w_[:3 * H], out=m[:, H:])
        return torch.bmm(lhs, m)

    out[..., :H] = pull(w_hh)
    return pull(w_ih) if need_input else None


CELL_VJPS: dict[str, CellVJP] = {"elman": _elman_vjp, "gru": _gru_vjp, "lstm": _lstm_vjp}


def _rnn_analytic(core: RNNCore, x: Tensor, zs: Tensor, p: int) -> Tensor:
    """G ← G · J_t from G = ∂y_T/∂z_T, layer by layer from the top within each step. → (B, H, D)."""
    B, T, _ = x.shape
    H, S, L = core.hidden_size, core.layer_state, core.num_layers
    weights = [core.layer_weights(layer) for layer in range(L)]
    cell_vjp = CELL_VJPS[core.kind]
    G = x.new_zeros(B, H, core.state_dim)
    G[:, :, (L - 1) * S:(L - 1) * S + H] = torch.eye(H, dtype=x.dtype, device=x.device)
    spare = torch.empty_like(G)
    for t in range(T - 1, p - 1, -1):  # 0-based step t maps zs[:, t−1] to zs[:, t]
        states = zs[:, t - 1].split(S, dim=-1)
        inputs = [x[:, t]]
        for layer in range(L - 1):
            inputs.append(core.cell(inputs[-1], states[layer], *weights[layer])[0])
        g_in = None
        for layer in reversed(range(L)):
            cols = slice(layer * S, (layer + 1) * S)
            if g_in is not None:  # layer+1 read this layer's new h within the same step
                G[..., layer * S:layer * S + H] += g_in
            g_in = cell_vjp(inputs[layer], states[layer], weights[layer], G[..., cols], spare[..., cols], layer > 0)
        G, spare = spare, G
    return G


# ---------------------------------------------------------------------------------------------
# Analytic engine, single-block S4D

def s4d_readout_jacobian(block: S4DBlock, y: Tensor) -> Tensor:
    """∂ readout(y)/∂y for GELU → Conv1d(H, 2H, 1) → GLU at pre-GELU values y (B, H) → (B, H, H)."""
    conv = block.output_linear[0]
    w = conv.weight[:, :, 0]  # (2H, H)
    cdf = 0.5 * (1 + torch.erf(y / math.sqrt(2)))
    gelu, dgelu = y * cdf, cdf + y * torch.exp(-0.5 * y * y) / math.sqrt(2 * math.pi)  # exact GELU
    a, b = (gelu @ w.T + conv.bias).chunk(2, dim=-1)
    sig = torch.sigmoid(b)
    return _scaled_rows(torch.stack([sig, a * sig * (1 - sig)], dim=1), w) * dgelu[:, None, :]


def _s4d_analytic(core: S4DCore, x: Tensor, zs: Tensor, p: int) -> Tensor:
    """J[i, (h, n, re/im)] = R_T[i, h] · (2a, −2b), a + ib = C_hn dA_hn^(T−p). → (B, H, D)."""
    B, T, _ = x.shape
    block = core.ssm[0]
    dA, _, C = block.kernel.discrete()  # (H, N/2) complex
    u = x[:, T - 1] @ core.in_proj.weight.T + core.in_proj.bias  # (B, H)
    pair = zs[:, T - 1].reshape(B, core.channels, core.modes, 2)
    y = 2 * (C * torch.complex(pair[..., 0], pair[..., 1])).real.sum(-1) + block.D * u  # (B, H), D-skip included
    k = C * dA ** (T - p)
    gain = torch.stack([2 * k.real, -2 * k.imag], dim=-1)  # (H, N/2, 2): view_as_real layout
    return (s4d_readout_jacobian(block, y)[..., None, None] * gain).reshape(B, core.out_dim, -1)


def analytic_unsupported(core: Core) -> str | None:
    """Why the analytic engine cannot handle ``core`` (None when it can)."""
    if isinstance(core, RNNCore):
        if core.cell is not CELLS.get(core.kind):
            return f"its {core.kind!r} core has a replaced cell function"
        return None
    if isinstance(core, S4DCore):
        if len(core.ssm) != 1:
            return f"it covers single-block S4D only (this core has {len(core.ssm)} blocks)"
        if "readout" in vars(core.ssm[0]):
            return "the S4D block's readout has been replaced"
        return None
    return f"it does not know {type(core).__name__}"


def _analytic_engine(core: Core, x: Tensor, zs: Tensor, p: int) -> Tensor:
    """Elementwise per-step Jacobians chained with bmm (RNN) or the S4D closed form. → (B, H, D)."""
    if isinstance(core, RNNCore):
        return _rnn_analytic(core, x, zs, p)
    return _s4d_analytic(core, x, zs, p)  # type: ignore[arg-type]


Engine = Callable[[Core, Tensor, Tensor, int], Tensor]
METHODS: dict[str, Engine] = {"func": _func_engine, "vjp": _vjp_engine, "analytic": _analytic_engine}


# ---------------------------------------------------------------------------------------------
# Public API

def resolve_method(core: Core, method: str) -> str:
    """The engine name that ``method`` ("auto" or a key of METHODS) means for ``core``."""
    check(method == "auto" or method in METHODS,
          f"method: got {method!r}; valid values are auto, {', '.join(METHODS)}")
    reason = analytic_unsupported(core)
    if method == "auto":
        return "vjp" if reason else "analytic"
    check(method != "analytic" or reason is None,
          f"method: 'analytic' cannot be used here: {reason}; use 'vjp' or 'auto'")
    return method


def iter_state_jacobian(model: nn.Module, tokens: Tensor, position: int, *, method: str = "auto",
                        chunk: int = 64) -> Iterator[tuple[slice, JacobianResult]]:
    """:func:`state_jacobian` chunk by chunk: yields (rows of ``tokens``, result for those rows), each
    result holding ``jac`` (b, H, D), ``output`` (b, H), ``state`` (b, D) for b ≤ ``chunk`` sequences."""
    check(isinstance(tokens, Tensor) and tokens.dim() == 2 and not tokens.is_floating_point(),
          f"tokens: expected an integer tensor of shape (B, T); got "
          f"{tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__}")
    check(tokens.shape[0] >= 1, "tokens: got 0 sequences; need at least one")
    T = tokens.shape[1]
    try:
        position = operator.index(position)
    except TypeError:
        raise GradscopeError(f"position: got {position!r}; it must be an integer in [1, {T}]") from None
    check(1 <= position <= T,
          f"position: got {position}; it must lie in [1, {T}] (1-based, T = {T} steps per sequence)")
    check(isinstance(chunk, int) and chunk >= 1, f"chunk: got {chunk}; it must be a positive integer")
    core: Core = model.core
    name = resolve_method(core, method)
    engine = METHODS[name]
    tokens = tokens.to(next(model.parameters()).device)
    for start in range(0, tokens.shape[0], chunk):
        rows = slice(start, min(start + chunk, tokens.shape[0]))
        # no_grad per chunk, never across the yield: grad mode is thread-local, and a generator suspended
        # (or finalised later, on another thread) inside no_grad would leave its caller without gradients
        with torch.no_grad():  # torch.func transforms still differentiate; nothing else builds a graph
            x = model.core_inputs(tokens[rows])  # (b, T, in), held fixed
            ys, zs = core.scan(x)  # (b, T, H), (b, T, D)
            jac = engine(core, x, zs, position)
            # clone: views would keep the whole (b, T, D) scan alive
            result = JacobianResult(jac=jac, output=ys[:, T - 1].clone(), state=zs[:, position - 1].clone(),
                                    method=name)
        yield rows, result


def state_jacobian(model: nn.Module, tokens: Tensor, position: int, *, method: str = "auto",
                   chunk: int = 64) -> JacobianResult:
    """J = ∂y_T/∂z_p for every sequence, steps p+1 … T run with their inputs held fixed.

    model: a :class:`~gradscope.models.seq.SeqModel` (any dtype; everything runs in it).
    tokens: (B, T) token ids; T = total length (input and output phase). position: p, 1-based, in [1, T].
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
    """Conjugate-Wirtinger view of an S4D Jacobian: J_c = ½(∂/∂Re x + i ∂/∂Im x).

    jac (..., D) on the real view (re/im pairs adjacent) → complex (..., D/2), one column per mode.
    """
    check(isinstance(model.core, S4DCore),
          f"model: the Wirtinger view needs an S4D core (complex state); got {type(model.core).__name__}")
    return 0.5 * torch.complex(jac[..., 0::2], jac[..., 1::2])
