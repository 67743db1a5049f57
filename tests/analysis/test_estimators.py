"""Matrix-free dynamics estimators (issue #37 part 1) against the exact values on small GRU, S4D and
Mamba models: the stored error bars cover the exact value at their nominal rate over many seeds, and
the singular-value bound always holds."""

from __future__ import annotations

import torch

from gradscope.analysis import dynamics as dyn
from gradscope.analysis.estimators import flow_hutchinson, grid_hutchinson, step_fro_hutchinson, step_top_singular
from gradscope.analysis.tape import StateTape
from gradscope.models.core import step_jacobian

from tests.helpers.cores import tiny_model

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


def test_flow_error_bars_cover_the_exact_flow_at_their_nominal_rate() -> None:
    """The matrix-free flow (one reverse chain of 16 probe rows) against the exact ‖∂y_T/∂z_k‖_F; with a
    state tape that recomputes segments (every 2 steps) the estimate is the same as from kept states."""
    for name in CORES:
        model = tiny_model(name, 12, 4, 24)  # H = 24 outputs > 16 probes: estimated, not exact
        tokens = torch.randint(0, 12, (2, 6), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            x = model.core_inputs(tokens)
            prev = dyn.previous_states(model.core, x)
        exact, _ = dyn.gradient_flow(model, tokens)
        finite = torch.isfinite(exact)
        assert finite[:, :-1].all(), name
        hits, cells = 0, 0
        for seed in range(40):
            est, se = flow_hutchinson(model.core, x, prev, probes=16, generator=torch.Generator().manual_seed(seed))
            assert torch.equal(torch.isfinite(est), finite), name  # column T NaN exactly when the exact one is
            hits += int(((est - exact).abs() <= 2 * se)[finite].sum())
            cells += int(finite.sum())
        rate = hits / cells
        assert 0.88 <= rate <= 0.995, (name, rate)
        again, se2 = flow_hutchinson(model.core, x, StateTape(model.core, x, every=2), probes=16,
                                     generator=torch.Generator().manual_seed(39))
        torch.testing.assert_close(again, est, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(se2, se, rtol=0, atol=0, equal_nan=True)


def test_flow_with_no_more_outputs_than_probes_is_exact() -> None:
    for name in CORES:
        model, tokens, x, prev = _setup(name)  # H = 4 outputs <= 16 probes: the identity's rows, error 0
        exact, _ = dyn.gradient_flow(model, tokens)
        est, se = flow_hutchinson(model.core, x, prev, generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(est, exact, rtol=1e-12, atol=1e-12, equal_nan=True)
        assert (se[torch.isfinite(est)] == 0).all()
