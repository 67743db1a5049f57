"""minGRU (gradscope/models/mingru.py) against float64 oracles written here from the paper's
equations: the recurrence by hand, autograd Jacobians of that hand-written step, and the Lyapunov
spectrum of a diagonal cocycle (the time average of log(1 − u_t) per unit). The registry-wide tests
(test_jacobian, test_core) run the engines on it as on every core."""

from __future__ import annotations

import pytest
import torch

from gradscope.analysis.jacobian import state_jacobian
from gradscope.analysis.lyapunov import lyapunov_spectrum
from gradscope.cli.app import app

from tests.helpers.cores import rolled_jacobian, tiny_core, tiny_model

F64 = torch.float64
IN, H = 4, 5


def hand_step(core, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """h_t = (1 − u) h_{t−1} + u h̃ per layer, u = σ(W_u a + b_u), h̃ = W_h a + b_h (Feng et al. §3.1)."""
    a, out = x, []
    for layer, h in zip(core.layers, z.split(H, dim=-1)):
        w, b = layer.weight, layer.bias
        u = torch.sigmoid(a @ w[:H].T + b[:H])
        cand = a @ w[H:].T + b[H:]
        a = (1 - u) * h + u * cand
        out.append(a)
    return torch.cat(out, dim=-1)


def point(core, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(3, IN, generator=gen, dtype=F64), torch.randn(3, core.state_dim, generator=gen, dtype=F64)


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_step_and_its_jacobian_equal_the_hand_written_recurrence(layers: int) -> None:
    core = tiny_core("mingru", IN, H, layers)
    x, z = point(core)
    assert torch.allclose(core.step(x, z)[1], hand_step(core, x, z), rtol=0, atol=1e-14)
    ref = torch.stack([torch.autograd.functional.jacobian(lambda zz: hand_step(core, x[b:b + 1], zz[None])[0], z[b])
                       for b in range(3)])
    J = core.step_jacobian(x, z)
    assert (J - ref).abs().max() < 1e-13 and ref.abs().max() > 0.1
    blocks = core.diagonal_blocks(x, z)
    for layer in range(layers):
        rows = slice(layer * H, (layer + 1) * H)
        own = ref[:, rows, rows]
        assert torch.equal(own, torch.diag_embed(own.diagonal(dim1=1, dim2=2)))  # exactly diagonal: the carry only
        assert (blocks[layer] - own.diagonal(dim1=1, dim2=2)).abs().max() < 1e-14
        assert torch.count_nonzero(ref[:, rows, layer * H + H:]) == 0  # nothing above the diagonal (exact zeros)
    if layers > 1:
        assert ref[:, H:2 * H, :H].abs().max() > 1e-3  # layer 2 reads layer 1's new h


def test_training_path_equals_the_functional_scan() -> None:
    """float32 as trained: the sequence forward and the step-by-step scan agree to a few ulps."""
    core = tiny_core("mingru", IN, H, 2).float()
    x = torch.randn(4, 9, IN, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(core(x), core.scan(x)[0], rtol=1e-6, atol=1e-6)


def test_structured_exponents_are_time_averages_of_log_one_minus_u() -> None:
    """One layer: J_t = diag(1 − u_t), so λ_i = mean_t log(1 − u_{t,i}) over the counted steps; the
    structured engine must give exactly that (sorted), and the dense Benettin engine agrees."""
    core = tiny_core("mingru", IN, H, 1)
    x = torch.randn(2, 200, IN, generator=torch.Generator().manual_seed(3), dtype=F64)
    w, b = core.layers[0].weight, core.layers[0].bias
    u = torch.sigmoid(x @ w[:H].T + b[:H])  # the gate reads only the input
    expected = torch.log(1 - u[:, 20:]).mean(1).sort(dim=-1, descending=True).values.detach()
    res = lyapunov_spectrum(core, x, warmup=20)
    assert (res.exponents - expected).abs().max() < 1e-12
    dense = lyapunov_spectrum(core, x, warmup=20, engine="dense")
    assert (dense.exponents - expected).abs().max() < 1e-10
    assert torch.isfinite(res.exponents).all()


def test_vjp_engine_with_structure_equals_the_brute_force() -> None:
    model = tiny_model("mingru", 6, 4, H, 2, "sinusoidal")
    toks = torch.randint(0, 7, (3, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        x = model.core_inputs(toks)
        zs = model.core.scan(x)[1]
    ref = rolled_jacobian(lambda xt, z: (None, hand_step(model.core, xt, z)), x, zs[:, 2], 3,
                          lambda out, z: z[:, H:])  # the top layer's h
    res = state_jacobian(model, toks, 3)
    assert res.method == "vjp" and (res.jac - ref).abs().max() < 1e-12


def test_trains_and_is_analysed_from_the_cli(runner, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = tmp_path / "run"
    done = runner.invoke(app, ["train", "--core", "mingru", "--vocab-size", "6", "--length", "4", "--embed-size", "4",
                               "--hidden-size", "8", "--iterations", "20", "--checkpoint-every", "20", "--heldout-size", "32",
                               "--grid-per-cell", "2", "--batch-size", "8", "-q", "-o", str(run)])
    assert done.exit_code == 0, done.stderr
    st = runner.invoke(app, ["stability", str(run), "-o", str(tmp_path / "st.zarr"), "-q", "--triplets", "4",
                             "--resamples", "100"])
    assert st.exit_code == 0, st.stderr
    dyn = runner.invoke(app, ["dynamics", str(run), "-o", str(tmp_path / "d.zarr"), "--parts", "lyapunov",
                              "--trajectories", "2", "--steps", "40", "--lyap-warmup", "5", "-q"])
    assert dyn.exit_code == 0, dyn.stderr
    import xarray as xr
    with xr.open_zarr(tmp_path / "d.zarr", consolidated=False) as ds:
        lam = ds["lyapunov"].values
    assert lam.shape[-1] == 8 and (lam < 0).all()  # 1 − u ∈ (0, 1): every exponent negative and finite
