"""Gradient stability of a model on probe triplets (docs/definitions.md §4), chunked so memory stays bounded.

For every triplet the Jacobians J = ∂h_{2L}/∂z_p of its three sequences are computed, scored in
pairs (base, same-target) and (base, same-suffix), and dropped; only per-pair numbers and the top
singular values are kept, so paper-size models (H = 512, 1024 triplets) fit in a few GB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from gradscope.analysis.cost import (MODULE_CALL, REFERENCE, ROW_VJP, SKETCH_FLOPS, SKETCH_PRODUCTS, VJP_MODULE, Rates,
                                     products_seconds)
from gradscope.analysis.jacobian import jvp_products, state_jacobian
from gradscope.analysis.lyapunov import analytic_jacobian
from gradscope.analysis.reduce import dot64, norm64
from gradscope.analysis.scores import (SCORES, companion_stats, finite_matrices, forward_similarity, svd_or_nan,
                                       wirtinger)
from gradscope.analysis.sketch import sketch_scores, sketch_tangents
from gradscope.fields import ESTIMATORS  # noqa: F401 - declared with the options
from gradscope.fields import CHECKPOINT_BUDGET_SECONDS, ESTIMATOR, JACOBIAN_METHOD
from gradscope.errors import GradscopeError, check
from gradscope.guard import memory_budget as available_budget
from gradscope.models.core import own_cost, own_products, weight_count
from gradscope.tasks.probes import Probes

PAIRS = ("same-target", "same-suffix")
# The rate every time estimate assumes: what a laptop CPU core pair sustains on float64 BLAS-3, as the
# dynamics budget (gradscope.workflows.dynamics.NOMINAL_FLOPS); float32 and narrower run at twice it.
NOMINAL_FLOPS = 2e10
PROBE_BUDGET = 1 << 30  # bytes of Jacobians (or sketch tangents) per chunk of probes, by default
OWN_PROBE_BUDGET = 4 << 30  # the same for a sketch through a core's own forward mode (models.core.step_tangents)
CHUNK = 32  # triplets at a time (probe_stability's chunk)
UNITS = (4, 16)  # independent sketch units the auto plan chooses between: the fewest it accepts, the most it uses


@dataclass(frozen=True)
class StabilityResult:
    """Per-pair results; every tensor is on the CPU, float64.

    scores[kind] (2 pair, n); stats[name] (2 pair, n); singular_values (3 member, n, k);
    wirtinger_real / wirtinger_imag (2 pair, n) for S4D (the conjugate-Wirtinger score), else None.
    nonfinite (3 member, n) bool: the Jacobian has a NaN or Inf entry (a diverged model); every
    score and statistic of its pairs is then NaN.
    """

    scores: dict[str, torch.Tensor]
    stats: dict[str, torch.Tensor]
    singular_values: torch.Tensor
    wirtinger_real: torch.Tensor | None
    wirtinger_imag: torch.Tensor | None
    nonfinite: torch.Tensor | None = None
    errors: dict[str, torch.Tensor] | None = None  # sketch: "se_<variable>" → (2 pair, n) jackknife standard errors
    estimator: str = "exact"

    @property
    def nonfinite_count(self) -> int:
        """Jacobians with a NaN or Inf entry."""
        return 0 if self.nonfinite is None else int(self.nonfinite.sum())


def wirtinger_score(ja: torch.Tensor, jb: torch.Tensor) -> torch.Tensor:
    """Complex default score of conjugate-Wirtinger Jacobians (..., D_out, M):
    Σ_i ⟨a_i, b_i⟩ / Σ_i ‖a_i‖‖b_i‖ with ⟨a, b⟩ = Σ_m a_m conj(b_m). Its real part is the real-view score."""
    num = dot64(ja, jb.conj(), (-2, -1))  # sums in float64 (complex128)
    den = (norm64(ja) * norm64(jb)).sum(-1)
    out = torch.where(den > 0, num / den.where(den > 0, 1.0), torch.full_like(num, complex(float("nan"), 0.0)))
    return out.to(torch.promote_types(ja.dtype, jb.dtype))


def triplets_per_chunk(model: nn.Module, requested: int, budget_bytes: int, steps: int = 0) -> int:
    """At most ``requested`` triplets, fewer if their 3 Jacobians (D_out × D each) and scanned
    states (``steps`` × D each) would exceed the budget.
    (A paper-size S4D Jacobian is 512 × 32768 floats = 64 MB per sequence.)"""
    param = next(model.parameters())
    per_triplet = 3 * (model.core.out_dim + steps) * model.core.state_dim * param.element_size()
    return max(1, min(requested, budget_bytes // max(per_triplet, 1)))


@dataclass(frozen=True)
class StabilityPlan:
    """How :func:`probe_stability` computes the scores, decided before any work (:func:`plan_stability`):
    ``estimator`` "exact" (every Jacobian formed, in chunks of triplets) or "sketch" (``columns``
    Jacobian–vector products per sequence, ``units`` independent jackknife units, standard errors
    stored), the estimated ``seconds`` and peak ``bytes``, and ``note``, one line saying why."""

    estimator: str
    units: int
    columns: int
    seconds: float
    bytes: int
    note: str


def step_flops(core: nn.Module) -> float:
    """Estimated flops of one step of one sequence, and of one Jacobian–vector product through it:
    a multiply-add per weight, plus 20 elementwise operations per state number (gates, norms, the
    state update of a diagonal structure)."""
    return 2.0 * weight_count(core) + 20.0 * core.state_dim


def plan_stability(core: nn.Module, sequences: int, steps: int, position: int, *, estimator: str = ESTIMATOR,
                   units: int | None = None, checkpoint_budget_seconds: float = CHECKPOINT_BUDGET_SECONDS,
                   element_size: int = 4, memory_bytes: int | None = None,
                   rates: Rates = REFERENCE) -> StabilityPlan:
    """The one estimate of time and memory that decides exact or sketch, for ``sequences`` probe
    sequences of ``steps`` steps with z_p at ``position``: exact forms J (H × D) per sequence by H
    reverse products through the tail; a sketch runs ``columns`` forward products, never H × D.
    Estimates: flops (:func:`step_flops` per step and per product) at :data:`NOMINAL_FLOPS` (twice it
    for float32 and narrower), plus each step call's dispatch and each product's fixed and per-column
    cost (:mod:`gradscope.analysis.cost`; chunks of :data:`CHUNK` triplets); memory for one triplet: J, its products and the scan, 3 · (2H + T) · D
    numbers exact, 3 · 8 · columns · D sketched. ``estimator="auto"``: exact when it fits
    ``checkpoint_budget_seconds`` and ``memory_bytes`` (default: the memory budget, :func:`gradscope.guard.memory_budget`),
    else the sketch with the most units in :data:`UNITS` that fits the time budget. ``rates``: the machine's
    against the constants' CPU (:class:`~gradscope.analysis.cost.Rates`; :func:`gradscope.rates.machine_rates`)."""
    check(estimator in ESTIMATORS, f"estimator: got {estimator!r}; valid values are {', '.join(ESTIMATORS)}")
    check(units is None or (isinstance(units, int) and not isinstance(units, bool) and 2 <= units <= 1024),
          f"sketch_units: got {units!r}; it must be an integer in [2, 1024]")
    D, H = int(core.state_dim), int(core.out_dim)
    complex_pairs = bool(getattr(core, "complex_state", False))
    rate = NOMINAL_FLOPS * (2 if element_size <= 4 else 1)
    f = step_flops(core)
    tail = steps - position + 1
    memory = available_budget() if memory_bytes is None else memory_bytes
    # Python and dispatch per step call, by chunk of CHUNK triplets: what a small model's time is made of
    modules = sum(1 for _ in core.modules())
    batch = min(sequences, 3 * CHUNK)
    chunks = -(-sequences // batch)
    c, d = rates.flop, rates.call
    at = "" if rates == REFERENCE else f" at {rates.describe()}"
    scan_s = chunks * steps * modules * MODULE_CALL * d
    exact_s = sequences * (steps * f + tail * H * f) / rate * c + scan_s
    if not analytic_jacobian(core):  # the reverse chain: a vmapped pullback of the H rows per step
        exact_s += chunks * tail * (modules * VJP_MODULE + batch * H * ROW_VJP) * d
    exact_b = 3 * (2 * H + steps) * D * element_size

    def columns(u: int) -> int:
        return 2 * u if complex_pairs else u

    chain = own_cost(core).get("chain")  # a core's own span products price the whole tangent chain

    def sketch(u: int) -> tuple[float, int]:
        products = products_seconds("jvp", chunks * tail, batch * columns(u), D=D, modules=modules,
                                    params=weight_count(core), step_flops=0.0,  # the flops are counted at rate
                                    own=chain is None and "jvp" in own_products(core), rates=rates,
                                    own_factor=own_cost(core).get("jvp"))
        sketch_rate = SKETCH_FLOPS * (1 if element_size <= 4 else 0.5)
        tangents = sequences * tail * columns(u) * f / sketch_rate * c + SKETCH_PRODUCTS * products
        return (sequences * steps * f / sketch_rate * c + scan_s + tangents * (1.0 if chain is None else chain),
                3 * 8 * columns(u) * D * element_size)

    def sketched(u: int, why: str) -> StabilityPlan:
        secs, nbytes = sketch(u)
        return StabilityPlan("sketch", u, columns(u), secs, nbytes,
                             f"stability: estimated from a sketch of {columns(u)} Jacobian–vector products per "
                             f"sequence ({u} jackknife units; ~{secs:,.0f} s{at}, {nbytes / 1e9:.2f} GB), standard "
                             f"errors stored beside each score: {why}")

    exact_why = f"exact J = ∂y_T/∂z_p ({H} × {D}) would take ~{exact_s:,.0f} s and {exact_b / 1e9:.2f} GB per triplet"
    if estimator == "exact" or (estimator == "auto" and units is None and exact_s <= checkpoint_budget_seconds
                                and exact_b <= memory):
        why = "asked for" if estimator == "exact" else f"it fits the {checkpoint_budget_seconds:g} s budget and memory"
        return StabilityPlan("exact", 0, 0, exact_s, exact_b,
                             f"stability: exact Jacobians ({H} × {D} per sequence; ~{exact_s:,.0f} s{at}, "
                             f"{exact_b / 1e9:.2f} GB per triplet): {why}")
    if units is not None:
        return sketched(units, "asked for" if estimator == "sketch" else exact_why)
    fits = [u for u in range(UNITS[1], UNITS[0] - 1, -1) if sketch(u)[0] <= checkpoint_budget_seconds]
    if fits:
        return sketched(fits[0], "asked for" if estimator == "sketch" else f"{exact_why} (budget {checkpoint_budget_seconds:g} s)")
    if estimator == "sketch":
        return sketched(UNITS[0], f"asked for; over the {checkpoint_budget_seconds:g} s budget")
    raise GradscopeError(f"checkpoint_budget_seconds: {exact_why}, and a sketch of {UNITS[0]} units ~{sketch(UNITS[0])[0]:,.0f} s "
                         f"(budget {checkpoint_budget_seconds:g} s); raise the budget, or use fewer triplets or shorter probes")


def probe_stability(model: nn.Module, probes: Probes, position: int, *, method: str = JACOBIAN_METHOD,
                    chunk: int = CHUNK, top_sv: int = 64, on_chunk: Callable[[int], None] | None = None,
                    memory_budget: int | None = None, output_phase: int | None | str = "query",
                    plan: StabilityPlan | None = None, seed: int = 0) -> StabilityResult:
    """Stability scores of ``model`` on ``probes`` at target ``position`` (1-based).

    Each probe sequence (L tokens) is followed by an output phase of L copies of one token: the
    model's query token (``output_phase="query"``, gradscope's and the paper's models), a filler
    token id, or none (None: y_T is read right after the probe's last token).
    Up to ``chunk`` triplets (3·chunk sequences) are processed at a time, fewer when their Jacobians
    would exceed ``memory_budget`` bytes (default :data:`PROBE_BUDGET`; :data:`OWN_PROBE_BUDGET` for a sketch
    through a core's own forward mode); ``on_chunk(k)`` reports progress.
    A Jacobian with a NaN or Inf entry (a diverged model) gives NaN scores and statistics for its
    pairs, and is flagged in ``nonfinite``; it never stops the analysis.
    ``plan`` (:func:`plan_stability`; None: exact): a sketch plan estimates the scores, ``fro_*`` and
    the Wirtinger parts from Jacobian–vector products (:mod:`gradscope.analysis.sketch`) with their
    standard errors in ``errors``, drawn from ``seed``; statistics that need all of J (row cosines,
    singular values, effective rank, subspace similarity) are then NaN, ``forward_sim`` stays exact.
    """
    if output_phase == "query":
        output_phase = getattr(model, "query_token", None)
        check(output_phase is not None, "output_phase: this model has no query token; give a filler token id or None")
    device = next(model.parameters()).device
    complex_state = bool(getattr(model.core, "complex_state", False))
    steps = probes.length * (1 if output_phase is None else 2)
    if plan is not None and plan.estimator == "sketch":
        return _sketch_stability(model, probes, position, plan, chunk=chunk, top_sv=top_sv, on_chunk=on_chunk,
                                 memory_budget=memory_budget, output_phase=output_phase, seed=seed)
    chunk = triplets_per_chunk(model, chunk, PROBE_BUDGET if memory_budget is None else memory_budget, steps)
    parts, keep = _accumulator()
    nonfinite: list[torch.Tensor] = []
    for n, inputs in _chunks(probes, chunk, output_phase, device):
        res = state_jacobian(model, inputs, position, method=method, chunk=3 * n)
        jac = res.jac.reshape(n, 3, *res.jac.shape[1:])  # (n, 3, D_out, D)
        out = res.output.reshape(n, 3, -1)  # (n, 3, D_out)
        ja, jb = jac[:, :1].expand(-1, 2, -1, -1), jac[:, 1:]  # base against both partners: (n, 2, D_out, D)
        ya, yb = out[:, :1].expand(-1, 2, -1), out[:, 1:]
        nonfinite.append(~finite_matrices(jac).T.cpu())  # (3, n)
        u, s = svd_or_nan(jac)  # one decomposition per sequence, reused
        svd_a = (u[:, :1].expand(-1, 2, -1, -1), s[:, :1].expand(-1, 2, -1))
        svd_b = (u[:, 1:], s[:, 1:])
        for kind, fn in SCORES.items():
            keep(f"score_{kind}", fn(ja, jb).T)  # (2, n)
        for name, value in companion_stats(ja, jb, ya, yb, svd_a=svd_a, svd_b=svd_b).items():
            keep(name, value.T)
        keep("singular_values", s[..., :top_sv].transpose(0, 1))  # (3, n, k)
        if complex_state:
            w = wirtinger_score(wirtinger(ja), wirtinger(jb)).T  # (2, n) complex
            keep("wirtinger_real", w.real)
            keep("wirtinger_imag", w.imag)
        if on_chunk is not None:
            on_chunk(n)
    cat = {name: torch.cat(values, dim=1) for name, values in parts.items()}
    scores, sv, wr, wi = _split(cat)
    return StabilityResult(scores, cat, sv, wr, wi, torch.cat(nonfinite, dim=1))


def _chunks(probes: Probes, chunk: int, output_phase: int | None, device: torch.device):  # noqa: ANN202 - a generator
    """(n, sequences (3n, T) on ``device``) for each run of up to ``chunk`` triplets, the output phase appended."""
    for start in range(0, len(probes), chunk):
        tokens = probes.tokens[start:start + chunk]  # (n, 3, L)
        yield tokens.shape[0], _probe_inputs(tokens, probes.length, output_phase).to(device)


def _probe_inputs(tokens: torch.Tensor, length: int, output_phase: int | None) -> torch.Tensor:
    """Triplets (n, 3, L) → sequences (3n, T) with the output phase appended."""
    inputs = tokens.reshape(-1, length)
    if output_phase is not None:
        inputs = torch.cat([inputs, torch.full((inputs.shape[0], length), int(output_phase))], dim=1)
    return inputs


def _accumulator() -> tuple[dict[str, list[torch.Tensor]], Callable[[str, torch.Tensor], None]]:
    """Per-chunk values by name, kept in float64 on the CPU (joined along the triplet axis at the end)."""
    parts: dict[str, list[torch.Tensor]] = {}

    def keep(name: str, value: torch.Tensor) -> None:
        parts.setdefault(name, []).append(value.detach().to("cpu", torch.float64))

    return parts, keep


def _split(cat: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor | None,
                                                  torch.Tensor | None]:
    """Take the scores, singular values and Wirtinger parts out of the joined values; the rest stay in ``cat``."""
    scores = {kind: cat.pop(f"score_{kind}") for kind in SCORES}
    return scores, cat.pop("singular_values"), cat.pop("wirtinger_real", None), cat.pop("wirtinger_imag", None)


def _sketch_stability(model: nn.Module, probes: Probes, position: int, plan: StabilityPlan, *, chunk: int,
                      top_sv: int, on_chunk: Callable[[int], None] | None, memory_budget: int | None,
                      output_phase: int | None, seed: int) -> StabilityResult:
    """:func:`probe_stability` from a sketch (see there). One Gaussian sketch per triplet, shared by its
    three members (the pairs' cross terms need the same S), drawn from ``seed``."""
    device = next(model.parameters()).device
    param = next(model.parameters())
    core = model.core
    D, H = core.state_dim, core.out_dim
    complex_pairs = bool(getattr(core, "complex_state", False))
    per_triplet = 3 * 8 * plan.columns * D * param.element_size()  # tangents and their step temporaries
    if memory_budget is None and "jvp" in own_products(core):
        # a core's own forward mode keeps ~6 tangent copies (two alternating buffers, the sketch and its
        # inputs); larger chunks fill its matrix products (mamba-130m, 2 threads: 0.50 s a sequence at 9 a
        # chunk, 0.41 at 24, 0.37 at 48), so its default budget is larger: OWN_PROBE_BUDGET, within the guard's
        per_triplet = 3 * 6 * plan.columns * D * param.element_size()
        memory_budget = min(OWN_PROBE_BUDGET, available_budget())
    budget = PROBE_BUDGET if memory_budget is None else memory_budget
    chunk = max(1, min(chunk, budget // max(per_triplet, 1)))
    k = min(top_sv, H, D)
    gen = torch.Generator().manual_seed(seed)
    parts, keep = _accumulator()
    nonfinite: list[torch.Tensor] = []
    for n, inputs in _chunks(probes, chunk, output_phase, device):
        S = sketch_tangents(n, plan.units, D, complex_pairs=complex_pairs, generator=gen, dtype=param.dtype)
        V = S.to(device)[:, None].expand(-1, 3, -1, -1).reshape(3 * n, plan.columns, D)  # one S per triplet
        y, P = jvp_products(model, inputs, position, V, chunk=3 * n)  # (3n, H), (3n, H, m)
        del V
        P = P.reshape(n, 3, H, plan.columns)
        out = y.reshape(n, 3, H)
        nonfinite.append(~(P.isfinite().all(-1).all(-1) & out.isfinite().all(-1)).T.cpu())  # (3, n)
        est = sketch_scores(P[:, :1].expand(-1, 2, -1, -1), P[:, 1:], complex_pairs=complex_pairs)
        ya, yb = out[:, :1].expand(-1, 2, -1), out[:, 1:]
        nan = torch.full((2, n), float("nan"), dtype=torch.float64)
        for kind in SCORES:
            value, se = est[f"score_{kind}"]
            keep(f"score_{kind}", value.T)
            keep(f"se_score_{kind}", se.T)
        for name in ("cos_mean", "cos_min", "cos_max", "spectral_a", "spectral_b", "eff_rank_a", "eff_rank_b",
                     "subspace_sim"):
            keep(name, nan)  # they need all of J at once
        for name in ("fro_a", "fro_b", "fro_diff"):
            value, se = est[name]
            keep(name, value.T)
            keep(f"se_{name}", se.T)
        keep("forward_sim", forward_similarity(ya, yb).T)
        keep("singular_values", torch.full((3, n, k), float("nan"), dtype=torch.float64))
        if complex_pairs:
            for name in ("wirtinger_real", "wirtinger_imag"):
                value, se = est[name]
                keep(name, value.T)
                keep(f"se_{name}", se.T)
        if on_chunk is not None:
            on_chunk(n)
    cat = {name: torch.cat(values, dim=1) for name, values in parts.items()}
    errors = {name: cat.pop(name) for name in list(cat) if name.startswith("se_")}
    scores, sv, wr, wi = _split(cat)
    bad = torch.cat(nonfinite, dim=1)
    bad_pairs = bad[:1] | bad[1:]  # (2, n): a pair with a non-finite member
    for table in (scores, cat, errors):
        for name, value in table.items():
            if name != "forward_sim":
                table[name] = value.masked_fill(bad_pairs, float("nan"))
    wr = None if wr is None else wr.masked_fill(bad_pairs, float("nan"))
    wi = None if wi is None else wi.masked_fill(bad_pairs, float("nan"))
    return StabilityResult(scores, cat, sv, wr, wi, bad, errors, "sketch")


