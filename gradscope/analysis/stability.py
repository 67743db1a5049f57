"""Gradient stability of a model on probe triplets (SPEC §4), chunked so memory stays bounded.

For every triplet the Jacobians J = ∂h_{2L}/∂z_p of its three sequences are computed, scored in
pairs (base, same-target) and (base, same-suffix), and dropped; only per-pair numbers and the top
singular values are kept, so paper-size models (H = 512, 1024 triplets) fit in a few GB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from gradscope.analysis.jacobian import state_jacobian
from gradscope.analysis.scores import SCORES, companion_stats, finite_matrices, svd_or_nan, wirtinger
from gradscope.errors import check
from gradscope.tasks.probes import Probes

PAIRS = ("same-target", "same-suffix")


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

    @property
    def nonfinite_count(self) -> int:
        """Jacobians with a NaN or Inf entry."""
        return 0 if self.nonfinite is None else int(self.nonfinite.sum())


def wirtinger_score(ja: torch.Tensor, jb: torch.Tensor) -> torch.Tensor:
    """Complex default score of conjugate-Wirtinger Jacobians (..., D_out, M):
    Σ_i ⟨a_i, b_i⟩ / Σ_i ‖a_i‖‖b_i‖ with ⟨a, b⟩ = Σ_m a_m conj(b_m). Its real part is the real-view score."""
    num = (ja * jb.conj()).sum((-2, -1))
    den = (torch.linalg.vector_norm(ja, dim=-1) * torch.linalg.vector_norm(jb, dim=-1)).sum(-1)
    return torch.where(den > 0, num / den.where(den > 0, 1.0), torch.full_like(num, complex(float("nan"), 0.0)))


def triplets_per_chunk(model: nn.Module, requested: int, budget_bytes: int, steps: int = 0) -> int:
    """At most ``requested`` triplets, fewer if their 3 Jacobians (D_out × D each) and scanned
    states (``steps`` × D each) would exceed the budget.
    (A paper-size S4D Jacobian is 512 × 32768 floats = 64 MB per sequence.)"""
    param = next(model.parameters())
    per_triplet = 3 * (model.core.out_dim + steps) * model.core.state_dim * param.element_size()
    return max(1, min(requested, budget_bytes // max(per_triplet, 1)))


def probe_stability(model: nn.Module, probes: Probes, position: int, *, method: str = "auto", chunk: int = 32,
                    top_sv: int = 64, on_chunk: Callable[[int], None] | None = None,
                    memory_budget: int = 1 << 30, output_phase: int | None | str = "query") -> StabilityResult:
    """Stability scores of ``model`` on ``probes`` at target ``position`` (1-based).

    Each probe sequence (L tokens) is followed by an output phase of L copies of one token: the
    model's query token (``output_phase="query"``, gradscope's and the paper's models), a filler
    token id, or none (None: y_T is read right after the probe's last token).
    Up to ``chunk`` triplets (3·chunk sequences) are processed at a time, fewer when their Jacobians
    would exceed ``memory_budget`` bytes; ``on_chunk(k)`` reports progress.
    A Jacobian with a NaN or Inf entry (a diverged model) gives NaN scores and statistics for its
    pairs, and is flagged in ``nonfinite``; it never stops the analysis.
    """
    if output_phase == "query":
        output_phase = getattr(model, "query_token", None)
        check(output_phase is not None, "output_phase: this model has no query token; give a filler token id or None")
    device = next(model.parameters()).device
    complex_state = bool(getattr(model.core, "complex_state", False))
    steps = probes.length * (1 if output_phase is None else 2)
    chunk = triplets_per_chunk(model, chunk, memory_budget, steps)
    parts: dict[str, list[torch.Tensor]] = {}
    nonfinite: list[torch.Tensor] = []

    def keep(name: str, value: torch.Tensor) -> None:
        parts.setdefault(name, []).append(value.detach().to("cpu", torch.float64))

    for start in range(0, len(probes), chunk):
        tokens = probes.tokens[start:start + chunk]
        n = tokens.shape[0]
        inputs = tokens.reshape(-1, probes.length)
        if output_phase is not None:
            inputs = torch.cat([inputs, torch.full((3 * n, probes.length), int(output_phase))], dim=1)
        inputs = inputs.to(device)
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
    scores = {kind: cat.pop(f"score_{kind}") for kind in SCORES}
    sv = cat.pop("singular_values")
    wr, wi = cat.pop("wirtinger_real", None), cat.pop("wirtinger_imag", None)
    return StabilityResult(scores, cat, sv, wr, wi, torch.cat(nonfinite, dim=1))
