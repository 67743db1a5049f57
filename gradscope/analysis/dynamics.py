"""Gradient dynamics of a recurrent core (docs/definitions.md §7): gradient flow, the (t, T) grid, step spectra
and the Lyapunov spectrum, all built on the step Jacobians J_t = ∂z_t/∂z_{t−1}.

Conventions. Steps are 1-based: z_k is the full real state right after input k is read
(``zs[:, k−1]`` of :meth:`Core.scan`), z_0 the zero state (or ``z0``); J_t (D × D) is taken at the
state before step t and that step's input. The state z is the *full* state of docs/definitions.md §4: every
layer; LSTM h and c (D = 2H per layer); S4D the complex modes on the real view (D = H·N per
block). Everything runs in the model's dtype; only the Lyapunov log-sums accumulate in float64.
A step Jacobian with a NaN or Inf entry (a diverged model) gives NaN norms, spectra and exponents;
decompositions never see it (LAPACK fails on it, MKL's eigenvalue routine crashes the process).
Step Jacobians come from :func:`gradscope.models.core.step_jacobian`: analytic for gradscope's
cores (O(D²) elementwise work per step and sequence), ``vmap(jacrev)`` of ``core.step`` for any
other protocol core (D reverse passes of a step).

Costs below are per sequence (or trajectory); D = state width, H = output width, T = steps.
Memory: every function holds O(B·D²) for the Jacobians of one step; :func:`tT_grid` holds
O(B·T·D²) (all running products at once), so give it a few sequences at a time. The states before
each step come from a :class:`~gradscope.analysis.tape.StateTape`, which keeps T × D of them only for
short runs; :func:`previous_states` returns them all, when asked.
"""

from __future__ import annotations

import math
import operator

import torch
from torch import Tensor, nn

from gradscope.analysis.jacobian import rows_vjp, state_readout
from gradscope.analysis.reduce import fro64, gram_blocks, norm64
from gradscope.analysis.scores import finite_only
from gradscope.analysis.tape import StateTape, state_at
from gradscope.errors import GradscopeError, check
from gradscope.fields import JACOBIAN_CHUNK, RARITY
from gradscope.models.core import diagonal_blocks, gate_terms, initial_state, scan, step_at, step_jacobian
from gradscope.models.structure import JacobianStructure, structure_of
from gradscope.tasks.vocab import sample_tokens

FLOW_METHODS = ("jacobian", "vjp")
# "auto" chains explicit D × D step Jacobians while D <= this × H (RNN stacks: D = H, 2H per layer), else
# row VJPs: for S4D (D = H·N, diagonal transitions) a VJP costs O(H·D) per step, the product 2·H·D²
JACOBIAN_MAX_RATIO = 8


# ---------------------------------------------------------------------------------------------
# Shared plumbing

def _inputs(model: nn.Module, tokens: Tensor, T: int | None, name: str = "T") -> tuple[nn.Module, Tensor]:
    """(core, core inputs (B, T, in)) of a gradscope model, tokens cut to their first ``T`` steps."""
    check(hasattr(model, "core") and hasattr(model, "core_inputs"),
          f"model: expected a gradscope model (gradscope.load(...).model or gradscope.wrap(...)); got "
          f"{type(model).__name__}, which has no core/core_inputs (wrap it with gradscope.wrap)")
    floats = isinstance(tokens, Tensor) and tokens.is_floating_point()
    check(isinstance(tokens, Tensor) and tokens.dim() == (3 if floats else 2) and not tokens.is_complex()
          and tokens.shape[0] >= 1 and tokens.shape[1] >= 1,
          f"tokens: expected integer token ids (B, T), or float input vectors (B, T, in) for a model that "
          f"reads them directly, with B, T >= 1; got "
          f"{tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__}")
    if T is not None:
        try:
            T = operator.index(T)
        except TypeError:
            raise GradscopeError(f"{name}: got {T!r}; it must be an integer in [1, {tokens.shape[1]}]") from None
        check(1 <= T <= tokens.shape[1], f"{name}: got {T}; it must lie in [1, {tokens.shape[1]}] (the tokens' length)")
        tokens = tokens[:, :T]
    param = next(model.parameters(), None)
    if param is not None:
        tokens = tokens.to(param.device)
    return model.core, model.core_inputs(tokens)


def previous_states(core: nn.Module, x: Tensor) -> Tensor:
    """The state before every step, z_0 … z_{T−1}: x (B, T, in) → (B, T, D), z_0 the core's initial
    state (:func:`gradscope.models.core.initial_state`, zero unless the core says otherwise)."""
    z0 = initial_state(core, x.shape[0], x)
    _, zs = scan(core, x, z0)  # (B, T, D): z_1 … z_T
    return torch.cat([z0[:, None], zs[:, :-1]], dim=1)


# ---------------------------------------------------------------------------------------------
# Gradient flow: g(k) = ‖∂y_T/∂z_k‖ from one reverse chain

def _flow_method(core: nn.Module, method: str) -> str:
    check(method == "auto" or method in FLOW_METHODS or (method == "structured" and diagonal_form(core) is not None),
          f"method: got {method!r}; valid values are auto, {', '.join(FLOW_METHODS)}")
    if method != "auto":
        return method
    if diagonal_form(core) is not None:
        return "structured"
    return "jacobian" if core.state_dim <= JACOBIAN_MAX_RATIO * core.out_dim else "vjp"


def _spectral_norm(G: Tensor) -> Tensor:
    """Largest singular value of each (B, H, D) matrix; for a wide G (D > 2H) from the H × H Gram
    matrix G·Gᵀ (one 2·H²·D product in G's dtype instead of an SVD of the H × D matrix, several times
    that; σ_max² is the Gram's norm, so it keeps the dtype's relative accuracy), its eigenvalues in
    float64."""
    if G.shape[-1] <= 2 * G.shape[-2]:
        return finite_only(lambda g: torch.linalg.matrix_norm(g, ord=2), G)

    gram = gram_blocks(G)  # float64 sums over blocks of D; non-finite G gives a non-finite Gram: checked there
    return finite_only(lambda m: torch.linalg.eigvalsh(m)[..., -1].clamp_min(0).sqrt(), gram).to(G.dtype)


def _diag_right(form: str, G: Tensor, d: Tensor) -> Tensor:
    """G · J for a (block-)diagonal J given by its compact diagonal d: G (B, H, D) → (B, H, D)."""
    B, H, D = G.shape
    if form == "diagonal":
        return G * d[:, None, :]
    if form == "complex_diagonal":  # [g_re, g_im] · [[a, −b], [b, a]] = (g_re + i g_im) · conj(a + ib) per mode
        g = torch.view_as_complex(G.reshape(B, H, D // 2, 2))
        return torch.view_as_real(g * d.conj()[:, None, :].to(g.dtype)).reshape(B, H, D)
    s = d.shape[-1]
    return torch.einsum("bxhs,bhst->bxht", G.view(B, H, D // s, s), d).reshape(B, H, D)


def gradient_flow(model: nn.Module, tokens: Tensor, T: int | None = None, *, method: str = "auto",
                  chunk: int = JACOBIAN_CHUNK) -> tuple[Tensor, Tensor]:
    """g(k) = ‖∂y_T/∂z_k‖ for every k = 1 … T, per sequence (docs/definitions.md §7 "gradient flow").

    model: anything with a protocol ``core`` and ``core_inputs`` (``gradscope.load(...).model``,
    ``gradscope.wrap(...)``). tokens: (B, T') token ids, or (B, T', in) float inputs for a wrapped
    model without an input map. T: the output step (default T' = all steps); later tokens are
    ignored. y_T is the core's output at step T, z_k the full state after step k, steps k+1 … T
    run with their inputs held fixed — column k−1 equals the norm of
    ``state_jacobian(model, tokens[:, :T], k).jac``.

    Returns (fro (B, T), spectral (B, T)) in the model's dtype: Frobenius and spectral (largest
    singular value) norms, unitless (output units per state unit). Column T needs the core's
    ``readout(x, z)``; without one it is NaN and the chain starts from ∂y_T/∂z_{T−1}.

    One reverse chain G_k = G_{k+1} · J_{k+1} from G_T = ∂y_T/∂z_T (H × D) passes every k.
    method "structured" (auto for a core whose J_t is one diagonal-type block, e.g. S4D): G · J from
    J's compact diagonal, O(H·D) per step; "jacobian": explicit step Jacobians, COST per step O(D²) to form J (analytic cores)
    + 2·H·D² flops for the product; "vjp": ``torch.func.vjp`` of one ``core.step`` per step,
    vmapped over the H rows (never forms D × D; O(H·D) per step for S4D's diagonal transitions,
    ~3·H·D² for an RNN cell); "auto": "jacobian" for D <= JACOBIAN_MAX_RATIO · H (RNN stacks),
    else "vjp" (S4D). Both: + an SVD of G (O(H·D·min(H, D))) per step for the spectral norm.
    ``chunk`` sequences are processed at once.
    """
    check(isinstance(chunk, int) and chunk >= 1, f"chunk: got {chunk!r}; it must be a positive integer")
    check(isinstance(tokens, Tensor) and tokens.dim() >= 2,
          f"tokens: expected token ids (B, T) or float inputs (B, T, in); got "
          f"{tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__}")
    fro, spectral = [], []
    for start in range(0, tokens.shape[0], chunk):
        with torch.no_grad():  # torch.func transforms still differentiate; nothing else builds a graph
            core, x = _inputs(model, tokens[start:start + chunk], T)
            f, s = _flow_chain(core, x, _flow_method(core, method))
        fro.append(f)
        spectral.append(s)
    return torch.cat(fro), torch.cat(spectral)


def _flow_chain(core: nn.Module, x: Tensor, method: str) -> tuple[Tensor, Tensor]:
    B, T, _ = x.shape
    prev = StateTape(core, x)  # z_{t−1} for step t = index t−1; segments recomputed for long runs
    eye = torch.eye(core.out_dim, dtype=x.dtype, device=x.device).expand(B, -1, -1)
    fro = x.new_full((B, T), math.nan)
    spectral = x.new_full((B, T), math.nan)

    def record(k: int, G: Tensor) -> None:  # G = ∂y_T/∂z_k (B, H, D)
        fro[:, k - 1] = fro64(G)
        spectral[:, k - 1] = _spectral_norm(G)

    z_T = step_at(core, x[:, T - 1], prev[T - 1], T - 1)[1]
    try:
        G = rows_vjp(lambda z: state_readout(core, x[:, T - 1], z), z_T, eye)  # ∂y_T/∂z_T
    except GradscopeError:  # no readout: g(T) stays NaN, start one step earlier
        if T == 1:
            return fro, spectral
        G = rows_vjp(lambda z: step_at(core, x[:, T - 1], z, T - 1)[0], prev[T - 1], eye)
        first = T - 1
    else:
        record(T, G)
        first = T
    if first == T - 1:
        record(T - 1, G)
    form = diagonal_form(core)
    for k in range(first - 1, 0, -1):  # G ← G · J_{k+1}: step k+1 reads x[:, k] at z_k = prev[:, k]
        if method == "structured":  # (block-)diagonal J_{k+1}: O(H·D)
            G = _diag_right(form, G, diagonal_blocks(core, x[:, k], prev[k], k)[0])
        elif method == "jacobian":
            G = torch.bmm(G, step_jacobian(core, x[:, k], prev[k], k))
        else:
            G = rows_vjp(lambda z: step_at(core, x[:, k], z, k)[1], prev[k], G)
        record(k, G)
    return fro, spectral


# ---------------------------------------------------------------------------------------------
# Structured step Jacobians (gradscope.models.structure): never D × D

def diagonal_form(core: nn.Module) -> str | None:
    """The form of J_t when it is one diagonal-type block (diagonal, complex_diagonal, block_diagonal),
    else None (dense, or block-triangular with blocks below the diagonal)."""
    structure = structure_of(core)
    return structure.blocks[0].form if structure.is_diagonal else None


def _magnitudes(structure: JacobianStructure, blocks: list[Tensor]) -> Tensor:
    """|eigenvalues| (B, D) of a block-triangular J_t from its compact diagonal ``blocks``: the union of
    the blocks' (complex modes twice, as on the real view; per-head and dense blocks by eigvals)."""
    out = []
    for blk, d in zip(structure.blocks, blocks):
        if blk.form == "complex_diagonal":
            out.append(d.abs().repeat_interleave(2, dim=-1))
        elif blk.form == "diagonal":
            out.append(d.abs())
        else:
            out.append(finite_only(lambda j: torch.linalg.eigvals(j).abs(), d).reshape(d.shape[0], -1))
    return torch.cat(out, dim=-1)


def _diagonal_svdvals(form: str, d: Tensor) -> Tensor:
    """Singular values (B, D) of a (block-)diagonal J_t from its compact diagonal, descending."""
    if form == "complex_diagonal":
        s = d.abs().repeat_interleave(2, dim=-1)  # a 2 × 2 rotation-scaling has both singular values |d|
    elif form == "diagonal":
        s = d.abs()
    else:
        s = finite_only(torch.linalg.svdvals, d).reshape(d.shape[0], -1)
    return s.sort(dim=-1, descending=True).values


def _diagonal_fro2(form: str, P: Tensor) -> Tensor:
    """‖·‖_F² of (block-)diagonal matrices from their compact diagonals P (..., n) or (..., h, s, s)."""
    if form == "complex_diagonal":
        return 2 * norm64(P).square()
    if form == "diagonal":
        return norm64(P).square()
    return norm64(P, (-3, -2, -1)).square()


# ---------------------------------------------------------------------------------------------
# (t, T) grid: ‖∂z_T/∂z_t‖_F for all t ≤ T

def tT_grid(model: nn.Module, tokens: Tensor, T_max: int | None = None) -> Tensor:
    """‖∂h_T/∂h_t‖_F for all 1 ≤ t ≤ T ≤ T_max (docs/definitions.md §7 "(t, T) grid"), per sequence.

    h is the full recurrent state z (D × D Jacobians ∂z_T/∂z_t): every layer; for an LSTM both h
    and c; for S4D the complex modes on the real view. tokens: (B, T') token ids (or float inputs,
    as in :func:`gradient_flow`); T_max defaults to T'.

    Returns (B, T_max, T_max) in the model's dtype, ``grid[:, t−1, T−1]`` = ‖∂z_T/∂z_t‖_F
    (unitless): the upper triangle t ≤ T; the diagonal is ‖I‖_F = sqrt(D); t > T is NaN.

    The step Jacobians are formed once each; the running products P_{t→T} = J_T ⋯ J_{t+1} of
    every start t advance together, one batched matmul J_T · P per end step T (no chain per T).
    COST: O(T²·D³) flops per sequence (T²/2 products of D × D matrices); memory O(B·T·D²) for the
    running products, so pass a few sequences at a time for long T or wide states.
    """
    with torch.no_grad():
        core, x = _inputs(model, tokens, T_max, name="T_max")
        B, T, _ = x.shape
        D = core.state_dim
        prev = StateTape(core, x)
        grid = x.new_full((B, T, T), math.nan)
        grid.diagonal(dim1=1, dim2=2).fill_(math.sqrt(D))
        form = diagonal_form(core)
        if form is not None:  # (block-)diagonal J_t: the running products stay (block-)diagonal, O(T²·D)
            P = None  # compact products of every running start t = 1 … end−1: (B, end−1, …)
            for end in range(2, T + 1):
                d = diagonal_blocks(core, x[:, end - 1], prev[end - 1], end - 1)[0]
                if form == "block_diagonal":
                    P = d[:, None] if P is None else torch.cat([d[:, None] @ P, d[:, None]], dim=1)
                else:
                    P = d[:, None] if P is None else torch.cat([d[:, None] * P, d[:, None]], dim=1)
                grid[:, :end - 1, end - 1] = _diagonal_fro2(form, P).sqrt().to(grid.dtype)
            return grid
        P = x.new_empty(B, max(T - 1, 1), D, D)  # slot t−1: P_{t→current end}
        spare = torch.empty_like(P)
        for end in range(2, T + 1):  # J_end maps z_{end−1} to z_end
            J = step_jacobian(core, x[:, end - 1], prev[end - 1], end - 1)  # (B, D, D)
            n = end - 2  # starts t = 1 … end−2 already running
            if n:
                torch.matmul(J[:, None], P[:, :n], out=spare[:, :n])
                P, spare = spare, P
            P[:, n] = J  # start t = end−1: P = J_end
            grid[:, :end - 1, end - 1] = fro64(P[:, :end - 1])
    return grid


# ---------------------------------------------------------------------------------------------
# Step spectra along a trajectory

def step_spectra(model: nn.Module, tokens: Tensor, *, top_k: int | None = None) -> dict[str, Tensor]:
    """Spectral radius and singular values of every step Jacobian J_t, t = 1 … T (docs/definitions.md §7).

    tokens: (B, T) token ids (or float inputs, as in :func:`gradient_flow`); the trajectory starts
    at the core's initial state (zero unless it says otherwise), where J_1 is taken.
    Returns ``radius`` (B, T) = max_i |eig_i(J_t)| and ``singular_values`` (B, T, k) descending
    (k = top_k, default all D; column 0 is the spectral norm), in the model's dtype, unitless.
    COST per step and sequence: O(D²) to form J_t + an eigenvalue and an SVD decomposition,
    O(D³) each (LAPACK, not batched across steps).
    """
    with torch.no_grad():
        core, x = _inputs(model, tokens, None)
        B, T, _ = x.shape
        D = core.state_dim
        k = D if top_k is None else top_k
        check(isinstance(k, int) and 1 <= k <= D, f"top_k: got {top_k!r}; it must be an integer in [1, {D}] or None")
        prev = StateTape(core, x)  # never T × D for a long run: segments recomputed (bit-identical)
        radius = x.new_empty(B, T)
        singular = x.new_empty(B, T, k)
        structure = structure_of(core)
        form = diagonal_form(core)
        for t in range(T):
            if form is not None:  # (block-)diagonal J_t: O(D) (per-head blocks: their own decompositions)
                blocks = diagonal_blocks(core, x[:, t], prev[t], t)
                radius[:, t] = _magnitudes(structure, blocks).amax(dim=-1)
                singular[:, t] = _diagonal_svdvals(form, blocks[0])[:, :k]
                continue
            J = step_jacobian(core, x[:, t], prev[t], t)
            if not structure.is_dense:  # block-triangular: the eigenvalues are the blocks' (no D × D eig)
                radius[:, t] = _radius_from_blocks(core, structure, x[:, t], prev[t], t)
                singular[:, t] = finite_only(torch.linalg.svdvals, J)[:, :k]
                continue
            radius[:, t] = finite_only(lambda j: torch.linalg.eigvals(j).abs().amax(dim=-1), J)
            singular[:, t] = finite_only(torch.linalg.svdvals, J)[:, :k]
    return {"radius": radius, "singular_values": singular}


def block_radius(core: nn.Module, x: Tensor, prev: Tensor | StateTape) -> Tensor:
    """ρ(J_t) (B, T) of a core with a declared (block-)triangular structure, from its diagonal blocks
    only (the eigenvalues of a block-triangular matrix are its diagonal blocks'): x (B, T, in), prev
    (B, T, D) the states before each step, or a :class:`~gradscope.analysis.tape.StateTape`."""
    structure = structure_of(core)
    return torch.stack([_radius_from_blocks(core, structure, x[:, t], state_at(prev, t), t) for t in range(x.shape[1])],
                       dim=1)


def _radius_from_blocks(core: nn.Module, structure: JacobianStructure, x_t: Tensor, prev_t: Tensor, t: int) -> Tensor:
    """ρ(J_t) (B,) of a (block-)triangular J_t: the largest eigenvalue magnitude of its diagonal blocks."""
    return _magnitudes(structure, diagonal_blocks(core, x_t, prev_t, t)).amax(dim=-1)


# Lyapunov spectra: gradscope.analysis.lyapunov (dense, partial and structured engines)

# ---------------------------------------------------------------------------------------------
# Inputs for long trajectories

def trajectory_tokens(vocab_size: int, T: int, n: int, seed: int, distribution: str = "dual",
                      rarity: float = RARITY) -> Tensor:
    """Token ids (n, T) drawn i.i.d. from the task's vocabulary distribution (docs/definitions.md §3, through
    :func:`gradscope.tasks.vocab.sample_tokens` with its own ``torch.Generator`` seeded ``seed``):
    ``uniform`` over K = ``vocab_size``, or ``dual``: Rare (upper half) with probability ``rarity``.
    Feed ``model.core_inputs(tokens)`` to :func:`lyapunov_spectrum`."""
    for name, value in (("vocab_size", vocab_size), ("T", T), ("n", n)):
        check(isinstance(value, int) and value >= (2 if name == "vocab_size" else 1),
              f"{name}: got {value!r}; it must be an integer >= {2 if name == 'vocab_size' else 1}")
    check(distribution in ("dual", "uniform"), f"distribution: got {distribution!r}; valid values are dual, uniform")
    check(distribution == "uniform" or 0.0 < rarity < 1.0, f"rarity: got {rarity!r}; it must lie in (0, 1)")
    gen = torch.Generator().manual_seed(seed)
    return sample_tokens((n, T), vocab_size, distribution, rarity, gen)


# ---------------------------------------------------------------------------------------------
# Gate terms along trajectories, and the static gate blocks of W_hh

def gate_norms(core: nn.Module, x: Tensor) -> tuple[tuple[str, ...], Tensor]:
    """‖term‖_F of each gate term of J_t (they sum to J_t) at every step: x (B, T, in) →
    (term names, (B, T, G)). Cost: one dense (B, D, D) term per gate and step."""
    z_prev = StateTape(core, x)  # never T × D for a long run
    names: tuple[str, ...] = ()
    rows = []
    form = diagonal_form(core)
    if form is not None and len(getattr(core, "gate_names", ())) == 1:  # one term, J_t itself: O(D)
        for t in range(x.shape[1]):
            d = diagonal_blocks(core, x[:, t], z_prev[t], t)[0]
            rows.append(_diagonal_fro2(form, d).sqrt()[:, None].to(x.dtype))
        return tuple(core.gate_names), torch.stack(rows, dim=1)
    for t in range(x.shape[1]):
        terms = gate_terms(core, x[:, t], z_prev[t], t)
        names = tuple(terms)
        rows.append(torch.stack([fro64(v) for v in terms.values()], dim=-1).to(x.dtype))  # (B, G)
    return names, torch.stack(rows, dim=1)


def block_spectra(core: nn.Module) -> dict[str, tuple[float, float]]:
    """(spectral norm, spectral radius) of each gate's block of W_hh (docs/definitions.md §7's static reference;
    {} for a core without ``recurrent_blocks``, such as S4D)."""
    out = {}
    for name, w in getattr(core, "recurrent_blocks", dict)().items():
        w = w.detach().double().cpu()
        out[name] = (float(finite_only(lambda m: torch.linalg.matrix_norm(m, ord=2), w)),
                     float(finite_only(lambda m: torch.linalg.eigvals(m).abs().max(), w)))
    return out
