"""Matrix-free dynamics estimators (issue #37 part 1) against the exact values on small GRU, S4D and
Mamba models: the stored error bars cover the exact value at their nominal rate over many seeds, and
the singular-value bound always holds."""

from __future__ import annotations

import torch

from gradscope.analysis import dynamics as dyn
from gradscope.analysis.estimators import grid_hutchinson, step_fro_hutchinson, step_top_singular
from gradscope.models.core import step_jacobian

from cores import tiny_model

CORES = ("gru", "s4d", "mamba")


def _setup(name: str, T: int = 6, gain: float = 1.0) -> tuple:
    model = tiny_model(name, 12, 4, 4, gain=gain)
    tokens = torch.randint(0, 12, (2, T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        x = model.core_inputs(tokens)
        prev = dyn.previous_states(model.core, x)
    return model, tokens, x, prev


def test_grid_error_bars_cover_the_exact_grid_at_their_nominal_rate() -> None:
    for name in CORES:
        model, tokens, x, prev = _setup(name)
        exact = dyn.tT_grid(model, tokens)
        upper = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
        hits, cells = 0, 0
        for seed in range(40):
            est, se = grid_hutchinson(model.core, x, prev, probes=16, generator=torch.Generator().manual_seed(seed))
            inside = (est - exact).abs() <= 2 * se
            hits += int(inside[:, upper].sum())
            cells += int(upper.sum()) * 2
            torch.testing.assert_close(est.diagonal(dim1=1, dim2=2), exact.diagonal(dim1=1, dim2=2))
        rate = hits / cells
        # ±2 SE is a nominal 95% interval; the normal approximation of 16 chi-square-like draws covers less
        assert 0.88 <= rate <= 0.995, (name, rate)


def test_step_fro_error_bars_cover_the_exact_norm() -> None:
    for name in CORES:
        model, tokens, x, prev = _setup(name)
        exact = torch.stack([torch.linalg.matrix_norm(step_jacobian(model.core, x[:, t], prev[:, t], t))
                             for t in range(x.shape[1])], dim=1)
        hits = 0
        for seed in range(40):
            est, se = step_fro_hutchinson(model.core, x, prev, probes=16, generator=torch.Generator().manual_seed(seed))
            hits += int(((est - exact).abs() <= 2 * se).sum())
        rate = hits / (40 * exact.numel())
        assert 0.88 <= rate <= 0.995, (name, rate)


def test_top_singular_values_lie_within_their_bound() -> None:
    for name in CORES:
        model, tokens, x, prev = _setup(name, gain=3.0)  # spread singular values: subspace iteration converges
        exact = torch.stack([torch.linalg.svdvals(step_jacobian(model.core, x[:, t], prev[:, t], t))
                             for t in range(x.shape[1])], dim=1)  # (B, T, D)
        for seed in range(2):
            est, bound = step_top_singular(model.core, x, prev, 3, generator=torch.Generator().manual_seed(seed))
            nearest = (est[..., :, None] - exact[..., None, :]).abs().amin(-1)  # the bound names some singular value
            assert (nearest <= bound * (1 + 1e-6) + 1e-12).all(), name
            torch.testing.assert_close(est, exact[..., :3], rtol=1e-3, atol=1e-6)
