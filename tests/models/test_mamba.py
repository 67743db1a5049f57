"""The selective SSM core (gradscope/models/mamba.py) against float64 oracles written here from the
equations of its docstring (Mamba, Gu & Dao 2023, Algorithm 2): the step by hand, autograd Jacobians
of that hand-written step, and the Lyapunov spectrum of its block-triangular cocycle (−∞ for every
window coordinate, the time average of Δ_t·A for every SSM coordinate). The registry-wide tests
(test_jacobian, test_core) run every Jacobian engine on it as on every core."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from gradscope.analysis.jacobian import state_jacobian
from gradscope.analysis.lyapunov import lyapunov_spectrum
from gradscope.cli.app import app
from gradscope.models.core import generic_step_jacobian

from tests.helpers.cores import rolled_jacobian, tiny_core, tiny_model

F64 = torch.float64
IN, H = 4, 5


def hand_step(core, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    """One step of the core from its weights, written from the equations (not its methods)."""
    E, K, N = core.inner, core.K, core.N
    u = x @ core.in_proj.weight.T + core.in_proj.bias
    new = []
    for layer, part in zip(core.layers, z.split(E * (K + N), dim=-1)):
        w_old, s_old = part[:, :E * K].reshape(-1, E, K), part[:, E * K:].reshape(-1, E, N)
        v = u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + torch.finfo(u.dtype).eps) * layer.norm.weight
        ag = v @ layer.in_proj.weight.T + layer.in_proj.bias
        a, g = ag[:, :E], ag[:, E:]
        w = torch.cat([w_old[:, :, 1:], a[:, :, None]], dim=-1)  # the window: oldest dropped, a appended
        c = F.silu((w * layer.conv.weight[:, 0]).sum(-1) + layer.conv.bias)
        r = layer.rank
        proj = c @ layer.x_proj.weight.T
        dt = F.softplus(proj[:, :r] @ layer.dt_proj.weight.T + layer.dt_proj.bias)
        Bm, Cm = proj[:, r:r + N], proj[:, r + N:]
        A = -torch.exp(layer.A_log)
        s = torch.exp(dt[:, :, None] * A) * s_old + (dt * c)[:, :, None] * Bm[:, None, :]
        y = ((s * Cm[:, None, :]).sum(-1) + layer.D * c) * F.silu(g)
        u = u + y @ layer.out_proj.weight.T + layer.out_proj.bias
        new += [w.flatten(1), s.flatten(1)]
    return u, torch.cat(new, dim=-1)


def point(core, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(3, IN, generator=gen, dtype=F64), torch.randn(3, core.state_dim, generator=gen, dtype=F64)


def autograd_jacobian(core, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return torch.stack([torch.autograd.functional.jacobian(lambda zz: hand_step(core, x[b:b + 1], zz[None])[1][0], z[b])
                        for b in range(x.shape[0])])


@pytest.mark.parametrize("layers", [1, 2])
def test_step_equals_the_hand_written_equations(layers: int) -> None:
    core = tiny_core("mamba", IN, H, layers)
    x, z = point(core)
    y, new = core.step(x, z)
    y_ref, new_ref = hand_step(core, x, z)
    assert (new - new_ref).abs().max() < 1e-13 and (y - y_ref).abs().max() < 1e-13
    assert (core.readout(x, new) - y_ref).abs().max() < 1e-13  # the output read back from the state


def test_training_path_equals_the_functional_scan() -> None:
    """float32 as trained: the sequence forward (conv1d, all steps' projections at once) and the
    step-by-step scan agree to a few ulps of the outputs."""
    core = tiny_core("mamba", IN, H, 2).float()
    x = torch.randn(4, 9, IN, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(core(x), core.scan(x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layers", [1, 2])
def test_declared_structure_and_blocks_equal_autograd(layers: int) -> None:
    """J_t of the hand-written step is block lower-triangular over (window, SSM state) per layer; the
    window's own block is a shift per channel and the SSM state's is diag(exp(Δ A)), exactly."""
    core = tiny_core("mamba", IN, H, layers)
    x, z = point(core)
    ref = autograd_jacobian(core, x, z)
    assert (generic_step_jacobian(core, x, z) - ref).abs().max() < 1e-12
    blocks, compact = core.jacobian_structure().blocks, core.diagonal_blocks(x, z)
    assert [b.form for b in blocks] == ["block_diagonal", "diagonal"] * layers
    E, K = core.inner, core.K
    for blk, got in zip(blocks, compact):
        own = ref[:, blk.start:blk.stop, blk.start:blk.stop]
        assert torch.count_nonzero(ref[:, blk.start:blk.stop, blk.stop:]) == 0  # nothing above the diagonal
        if blk.form == "diagonal":
            assert torch.equal(own, torch.diag_embed(own.diagonal(dim1=1, dim2=2)))
            assert (got - own.diagonal(dim1=1, dim2=2)).abs().max() < 1e-14
            assert (got > 0).all() and (got < 1).all()
        else:
            per_channel = own.reshape(3, E, K, E, K).diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2)
            shift = torch.diag(torch.ones(K - 1, dtype=F64), 1)
            assert torch.equal(per_channel, shift.expand_as(per_channel)) and torch.equal(got, per_channel)
            assert torch.count_nonzero(own) == 3 * E * (K - 1)  # no coupling between channels
    assert ref[:, blocks[1].start:blocks[1].stop, blocks[0].start:blocks[0].stop].abs().max() > 1e-3  # s reads w


def test_structured_exponents_are_minus_infinity_and_mean_log_decay() -> None:
    """One layer: the window's E·K exponents are −∞ (a nilpotent shift), the SSM state's are
    mean_t Δ_t·A per (channel, mode) over the counted steps (Δ computed here by hand); Σλ = −∞ =
    mean log|det J_t|."""
    core = tiny_core("mamba", IN, H, 1)
    x = torch.randn(2, 120, IN, generator=torch.Generator().manual_seed(3), dtype=F64)
    layer, E, K, N = core.layers[0], core.inner, core.K, core.N
    with torch.no_grad():
        z, dts = x.new_zeros(2, core.state_dim), []
        for t in range(x.shape[1]):
            u = x[:, t] @ core.in_proj.weight.T + core.in_proj.bias
            v = u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + torch.finfo(F64).eps) * layer.norm.weight
            a = (v @ layer.in_proj.weight.T + layer.in_proj.bias)[:, :E]
            w = torch.cat([z[:, :E * K].reshape(2, E, K)[:, :, 1:], a[:, :, None]], dim=-1)
            c = F.silu((w * layer.conv.weight[:, 0]).sum(-1) + layer.conv.bias)
            dts.append(F.softplus((c @ layer.x_proj.weight.T)[:, :layer.rank] @ layer.dt_proj.weight.T
                                  + layer.dt_proj.bias))
            z = hand_step(core, x[:, t:t + 1].squeeze(1), z)[1]
        dt = torch.stack(dts, dim=1)[:, 10:]  # counted steps
        ssm = (dt.mean(1)[:, :, None] * -torch.exp(layer.A_log)).reshape(2, -1)
    expected = torch.cat([ssm, torch.full((2, E * K), -math.inf, dtype=F64)], dim=1).sort(descending=True).values
    res = lyapunov_spectrum(core, x, warmup=10, sum_check=True)
    finite = E * N
    assert torch.isneginf(res.exponents[:, finite:]).all() and torch.isfinite(res.exponents[:, :finite]).all()
    assert (res.exponents[:, :finite] - expected[:, :finite]).abs().max() < 1e-12
    assert torch.isneginf(res.log_det_mean).all()


def test_vjp_engine_equals_the_brute_force_through_the_hand_step() -> None:
    model = tiny_model("mamba", 6, 4, H, 2, "sinusoidal")
    toks = torch.randint(0, 7, (3, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        x = model.core_inputs(toks)
        zs = model.core.scan(x)[1]
    ref = rolled_jacobian(lambda xt, z: hand_step(model.core, xt, z), x, zs[:, 2], 3, lambda out, z: out)
    res = state_jacobian(model, toks, 3)
    assert res.method == "vjp" and (res.jac - ref).abs().max() < 1e-12 and ref.abs().max() > 1e-3


def test_trains_and_is_analysed_from_the_cli(runner, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import xarray as xr

    run = tmp_path / "run"
    done = runner.invoke(app, ["train", "--core", "mamba", "--state-size", "2", "--conv-width", "3", "--vocab-size", "6",
                               "--length", "4", "--embed-size", "4", "--hidden-size", "4", "--iterations", "20",
                               "--checkpoint-every", "20", "--heldout-size", "32", "--grid-per-cell", "2", "--batch-size",
                               "8", "-q", "-o", str(run)])
    assert done.exit_code == 0, done.stderr
    st = runner.invoke(app, ["stability", str(run), "-o", str(tmp_path / "st.zarr"), "-q", "--triplets", "4",
                             "--resamples", "100"])
    assert st.exit_code == 0, st.stderr
    dyn = runner.invoke(app, ["dynamics", str(run), "-o", str(tmp_path / "d.zarr"), "--parts", "lyapunov",
                              "--trajectories", "2", "--steps", "40", "--lyap-warmup", "5", "-q"])
    assert dyn.exit_code == 0, dyn.stderr
    with xr.open_zarr(tmp_path / "d.zarr", consolidated=False) as ds:
        lam = ds["lyapunov"].values
    E, K = 4, 3  # expand 1 × H = 4 channels, window 3
    assert (lam == -math.inf).sum(-1).min() == E * K and (lam < 0).all()
