"""gradscope.wrap(transformers Mamba2ForCausalLM / Mamba2Model) against a float64 brute force through
transformers' own forward and cache (tests/helpers/adapterkit.py): the state Jacobian, the state's size,
each head's exponents, S(A, A) = 1, and the CLI on a saved model directory (issue #48)."""

from __future__ import annotations

import json
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

import gradscope  # noqa: E402
from gradscope.errors import GradscopeError  # noqa: E402
from tests.helpers.adapterkit import (Family, check_changed_mixer_refused, check_gradient_flow,  # noqa: E402
                                      check_lyapunov_sum, check_own_step_tangents, check_stability,
                                      check_state_jacobian,
                                      conv_cache_family, probes)

B, T, V = 3, 6, 20
RTOL = 2e-6  # transformers computes exp(Δ A) and its chunked scan in float32 even for a float64 model
LAYERS, HIDDEN, HEADS, HEAD_DIM, GROUPS, STATE, KERNEL = 2, 8, 4, 4, 2, 3, 3


def config(**extra) -> "transformers.Mamba2Config":  # noqa: ANN003
    return transformers.Mamba2Config(vocab_size=V, hidden_size=HIDDEN, state_size=STATE, num_hidden_layers=LAYERS,
                                     expand=2, conv_kernel=KERNEL, num_heads=HEADS, head_dim=HEAD_DIM,
                                     n_groups=GROUPS, chunk_size=4, use_conv_bias=True, residual_in_fp32=False,
                                     **extra)


def tiny(bare: bool = False, **extra) -> torch.nn.Module:  # noqa: ANN003
    torch.manual_seed(0)
    cls = transformers.Mamba2Model if bare else transformers.Mamba2ForCausalLM
    model = cls(config(**extra)).eval().double()
    backbone = getattr(model, "backbone", model)
    with torch.no_grad():  # the default init leaves D = 1, a unit norm and zero biases: make every term count
        for i, layer in enumerate(backbone.layers):
            gen = torch.Generator().manual_seed(10 + i)
            layer.mixer.D.uniform_(0.5, 1.5, generator=gen)
            layer.mixer.conv1d.bias.normal_(0.0, 0.2, generator=gen)
            layer.mixer.norm.weight.uniform_(0.5, 1.5, generator=gen)
            layer.mixer.dt_bias.normal_(0.0, 0.5, generator=gen)
            layer.norm.weight.uniform_(0.5, 1.5, generator=gen)
    return model


def family(model: torch.nn.Module) -> Family:
    """Mamba-2's cache in the documented layout (tests/helpers/adapterkit.conv_cache_family)."""
    return conv_cache_family(model, reverse=False, upcast=True)


@pytest.fixture(scope="module")
def mamba2():  # noqa: ANN201
    model = tiny()
    return model, gradscope.wrap(model), family(model)


def tokens(seed: int, n: int = B, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (n, length), generator=torch.Generator().manual_seed(seed))


def test_wrap_runs_on_the_model_itself_with_the_configured_state_size(mamba2) -> None:  # noqa: ANN001
    model, wrapped, _ = mamba2
    core = wrapped.core
    assert core.model is model.backbone and wrapped.readout is model.lm_head
    ours = {p.data_ptr() for p in wrapped.parameters()}
    assert all(p.data_ptr() in ours for p in model.parameters())  # the same tensors, no copies
    assert list(core.state_layout()) == ["l0/conv", "l0/ssm", "l1/conv", "l1/ssm"]
    inner = 2 * HIDDEN
    conv_channels = inner + 2 * GROUPS * STATE
    assert core.state_dim == LAYERS * (HEADS * HEAD_DIM * STATE + conv_channels * (KERNEL - 1))
    with torch.no_grad():
        logits = model(input_ids=tokens(9), use_cache=False).logits
        assert float((wrapped(tokens(9)) - logits).abs().max()) < 1e-5 * max(1.0, float(logits.abs().max()))


@pytest.mark.parametrize("p,method", [(1, "vjp"), (3, "func"), (T - 1, "auto")])
def test_state_jacobian_matches_the_library_cache(mamba2, p: int, method: str) -> None:  # noqa: ANN001
    model, wrapped, fam = mamba2
    check_state_jacobian(fam, wrapped, tokens(1), p, method, RTOL)


def test_stability_of_a_model_with_itself_is_one_and_matches_the_library(mamba2) -> None:  # noqa: ANN001
    model, wrapped, fam = mamba2
    check_stability(fam, wrapped, L=5, p=2, rtol=1e-6)
    toks = tokens(5)
    jac = gradscope.state_jacobian(wrapped, toks, position=2).jac
    from gradscope.analysis.scores import default_score
    same = default_score(jac, jac)
    assert torch.allclose(same, torch.ones_like(same), rtol=0, atol=1e-12)


def test_gradient_flow_and_lyapunov_sum(mamba2) -> None:  # noqa: ANN001
    model, wrapped, fam = mamba2
    check_gradient_flow(fam, wrapped, tokens(2, n=2), rtol=RTOL)
    check_lyapunov_sum(fam, wrapped, tokens(3, n=2, length=10), warmup=2, atol=1e-6)


def test_each_heads_exponent_is_its_mean_log_decay_with_multiplicity_p_n(mamba2) -> None:  # noqa: ANN001
    """The structured engine's spectrum: per layer and head, P·N exponents equal to the mean over the
    trajectory of log a_t = Δ_t,h · A_h (from the library's own forward, whose float32 scan bounds the
    agreement near 1e-8: not from the adapter),
    and the conv windows' −∞."""
    from gradscope.analysis.lyapunov import lyapunov_spectrum

    model, wrapped, _ = mamba2
    bb = model.backbone
    toks = tokens(7, n=1, length=12)
    warmup = 2
    with torch.no_grad():
        lam = lyapunov_spectrum(wrapped.core, wrapped.core_inputs(toks), warmup=warmup).exponents.reshape(-1)
    # the library's own per-step Δ: rerun its forward with a hook on each mixer's in_proj
    logs: list[torch.Tensor] = []
    hooks = []
    for layer in bb.layers:
        m = layer.mixer

        def grab(mod, inp, out, m=m):  # noqa: ANN001, ANN202
            dt = out[..., -m.num_heads:]
            logs.append(torch.nn.functional.softplus(dt + m.dt_bias) * -torch.exp(m.A_log))  # (1, T, H)
        hooks.append(m.in_proj.register_forward_hook(grab))
    with torch.no_grad():
        bb(input_ids=toks, use_cache=False)
    for h in hooks:
        h.remove()
    want = []
    for log_a in logs:  # per layer: (1, T, H) → the mean over the steps after warm-up, each head P·N times
        mean = log_a[0, warmup:].mean(0)
        want += [float(v) for v in mean for _ in range(HEAD_DIM * STATE)]
    finite = lam[torch.isfinite(lam)]
    assert finite.numel() == LAYERS * HEADS * HEAD_DIM * STATE
    got = sorted(float(v) for v in finite)
    assert max(abs(a - b) for a, b in zip(got, sorted(want), strict=True)) < 1e-6, (got[::HEAD_DIM * STATE], sorted(want)[::HEAD_DIM * STATE])
    assert int((lam == -math.inf).sum()) == LAYERS * (2 * HIDDEN + 2 * GROUPS * STATE) * (KERNEL - 1)


def test_the_bare_model_and_a_time_step_limit() -> None:
    bare = tiny(bare=True)
    wrapped = gradscope.wrap(bare)
    assert wrapped.readout is None
    check_state_jacobian(family(bare), wrapped, tokens(4), 2, "vjp", RTOL)
    limited = tiny(time_step_limit=(0.05, 0.5))
    assert gradscope.wrap(limited).core.limit == (0.05, 0.5)  # clamped as the library's full forward does


def test_a_changed_mixer_is_refused() -> None:
    check_changed_mixer_refused(tiny())


def test_cli_stability_and_dynamics_on_a_saved_directory(runner, tmp_path) -> None:  # noqa: ANN001
    import numpy as np
    import xarray as xr

    from gradscope.cli.app import app

    model = tiny().float()
    model.save_pretrained(tmp_path / "mamba2")
    assert json.loads((tmp_path / "mamba2" / "config.json").read_text())["architectures"] == ["Mamba2ForCausalLM"]
    probes_file = tmp_path / "p.npy"
    np.save(probes_file, probes(V, 3, 6, 2, seed=6).numpy())
    out = tmp_path / "s.zarr"
    result = runner.invoke(app, ["stability", str(tmp_path / "mamba2"), "--model-factory", "hf", "--probes",
                                 str(probes_file), "--target-pos", "2", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.stderr
    ds = xr.open_zarr(out)
    assert np.isfinite(ds["score_default"].values).all()
    dyn = tmp_path / "d.zarr"
    result = runner.invoke(app, ["dynamics", str(tmp_path / "mamba2"), "--model-factory", "hf", "--sequences", "2",
                                 "--steps", "40", "--trajectories", "2", "-o", str(dyn), "-q"])
    assert result.exit_code == 0, result.stderr


def test_mambapy_mamba2_is_refused_in_one_line_saying_why() -> None:
    """mambapy 1.2's Mamba-2 imports einops and mamba_ssm's Triton kernels and has no one-token step, so it
    cannot be built here: a module of that class (by name and library, as wrap recognises it) is refused."""
    fake = type("Mamba2", (torch.nn.Module,), {"__module__": "mambapy.mamba2"})()
    with pytest.raises(GradscopeError, match="mamba_ssm's GPU kernels") as err:
        gradscope.wrap(fake)
    assert "\n" not in str(err.value) and "Mamba2ForCausalLM" in str(err.value)


@pytest.mark.parametrize("k", [None, 50])
def test_a_head_scalar_declared_once_gives_the_per_entry_spectrum(mamba2, k) -> None:  # noqa: ANN001
    """The ssm block is declared diagonal with one value per head (size P·N): the structured engine keeps one
    accumulator a head and expands it. Its exponents, running history and error bars equal those of the
    same block declared entry by entry (size 1), all D and the top k."""
    import dataclasses

    from gradscope.analysis.lyapunov import lyapunov_spectrum
    from gradscope.models.structure import JacobianStructure

    model, wrapped, _ = mamba2
    core = wrapped.core
    declared = core.jacobian_structure()
    assert any(b.form == "diagonal" and b.size == HEAD_DIM * STATE for b in declared.blocks)
    per_entry = JacobianStructure(tuple(dataclasses.replace(b, size=1) if b.form == "diagonal" else b
                                        for b in declared.blocks))
    with torch.no_grad():
        x = wrapped.core_inputs(tokens(8, n=2, length=25))
        got = lyapunov_spectrum(core, x, warmup=3, exponents=k, sum_check=True)
        core.jacobian_structure = lambda: per_entry  # the instance's own declaration, entry by entry
        try:
            want = lyapunov_spectrum(core, x, warmup=3, exponents=k, sum_check=True)
        finally:
            del core.jacobian_structure
    for name in ("exponents", "running", "below_resolution"):  # the same sums: bit for bit
        torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=0, atol=0, equal_nan=True, msg=name)
    for name in ("se_batch", "drift"):  # the same formula on shorter vectors: a last-digit difference at most
        torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-12, atol=1e-15, equal_nan=True,
                                   msg=name)
    torch.testing.assert_close(got.log_det_mean, want.log_det_mean, rtol=1e-12, atol=0)


@pytest.mark.parametrize("limit", [None, (0.4, 0.9)])
def test_hand_derived_step_products_equal_torch_func(limit, monkeypatch) -> None:  # noqa: ANN001
    """The adapter's own forward and reverse step products (what the stability sketch and the estimated
    flow run at real size) against ``torch.func`` of its step, in float64, with and without a time-step
    limit that clamps some heads; then a chain of each (J V against the exact J, and the estimated flow
    with and without the hand-derived reverse)."""
    from gradscope.analysis.estimators import flow_hutchinson
    from gradscope.analysis.jacobian import jvp_products, state_jacobian
    from gradscope.models.adapters.hf_mamba2 import HFMamba2Core
    from gradscope.analysis.dynamics import previous_states
    from gradscope.models.core import generic_step_cotangents, step_cotangents

    wrapped = gradscope.wrap(tiny() if limit is None else tiny(time_step_limit=limit))
    core = wrapped.core
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(B, HIDDEN, generator=gen, dtype=torch.float64)
    z = torch.randn(B, core.state_dim, generator=gen, dtype=torch.float64)
    dz = torch.randn(4, B, core.state_dim, generator=gen, dtype=torch.float64)
    if limit is not None:  # the limit holds some heads' Δ at a bound (a zero derivative there) and not others
        m = core.model.layers[0].mixer
        raw = torch.split(m.in_proj(torch.randn(B, HIDDEN, dtype=torch.float64)), [core.I, core.C, core.H], -1)[2]
        dt = torch.nn.functional.softplus(raw + m.dt_bias)
        assert ((dt < limit[0]) | (dt > limit[1])).any() and ((dt > limit[0]) & (dt < limit[1])).any()
    check_own_step_tangents(core, x, z, dz)
    torch.testing.assert_close(step_cotangents(core, x, z, dz), generic_step_cotangents(core, x, z, dz),
                               rtol=1e-12, atol=1e-13)
    seq = tokens(5)
    V = torch.randn(B, 3, core.state_dim, generator=gen, dtype=torch.float64)
    _, P = jvp_products(wrapped, seq, 2, V)
    J = state_jacobian(wrapped, seq, 2).jac  # (B, H, D), exact
    torch.testing.assert_close(P, J @ V.transpose(1, 2), rtol=1e-10, atol=1e-12)
    with torch.no_grad():
        inputs = wrapped.core_inputs(tokens(6))
        prev = previous_states(core, inputs)
    ours = flow_hutchinson(core, inputs, prev, probes=4, generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(HFMamba2Core, "chain_tangents", None)
    monkeypatch.setattr(HFMamba2Core, "span_cotangents", None)
    monkeypatch.setattr(HFMamba2Core, "step_tangents", None)
    monkeypatch.setattr(HFMamba2Core, "step_cotangents", None)
    torch.testing.assert_close(jvp_products(wrapped, seq, 2, V)[1], P, rtol=1e-12, atol=1e-13)
    ref = flow_hutchinson(core, inputs, prev, probes=4, generator=torch.Generator().manual_seed(1))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13, equal_nan=True)
    assert torch.isfinite(ours[0][:, :-1]).all()


@pytest.mark.parametrize("limit", [None, (0.4, 0.9)])
def test_a_span_in_the_dual_form_equals_the_chained_steps(limit, monkeypatch) -> None:  # noqa: ANN001
    """``chain_tangents`` (a span layer by layer in the SSD form: what the stability sketch runs) against
    the hand-derived steps chained and against ``torch.func``'s, in float64: the last output and its m
    tangents, over spans of 1 to 9 steps that cross span boundaries (SPAN = 4) so the state and its
    tangent handed from one span to the next count too; a bare model with a time-step limit that clamps."""
    from gradscope.models.adapters.hf_mamba2 import HFMamba2Core
    from gradscope.models.core import chain_tangents, generic_step_tangents

    core = gradscope.wrap(tiny(bare=limit is not None, **({} if limit is None else {"time_step_limit": limit}))).core
    monkeypatch.setattr(HFMamba2Core, "SPAN", 4)
    gen = torch.Generator().manual_seed(11)
    for L in (1, 4, 5, 9):
        x = torch.randn(B, L, HIDDEN, generator=gen, dtype=torch.float64)
        z = torch.randn(B, core.state_dim, generator=gen, dtype=torch.float64)
        dz = torch.randn(3, B, core.state_dim, generator=gen, dtype=torch.float64)
        y, dy = chain_tangents(core, x, z, dz)
        zs, dzs = z, dz
        for t in range(L):
            y_ref, zs, dy_ref, dzs = generic_step_tangents(core, x[:, t], zs, dzs)
        torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(dy, dy_ref, rtol=1e-11, atol=1e-13, msg=f"{L} steps")
        with monkeypatch.context() as mp:  # the fallback (each step's own products, chained) agrees too
            mp.setattr(HFMamba2Core, "chain_tangents", None)
            torch.testing.assert_close(chain_tangents(core, x, z, dz)[1], dy_ref, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("limit", [None, (0.4, 0.9)])
def test_a_span_pulled_back_layer_by_layer_equals_the_chained_steps(limit, monkeypatch) -> None:  # noqa: ANN001
    """``span_cotangents`` (rows pulled back through a span layer by layer, with every step's squared norm:
    what the estimated flow runs) against ``torch.func``'s reverse steps chained, in float64: the rows on
    the span's first state and the float64 squared norms before each step; then the estimated flow over
    spans of 2 steps against the flow step by step."""
    from gradscope.analysis import estimators
    from gradscope.analysis.estimators import flow_hutchinson
    from gradscope.analysis.reduce import sumsq_blocks
    from gradscope.models.adapters.hf_mamba2 import HFMamba2Core
    from gradscope.analysis.dynamics import previous_states
    from gradscope.models.core import generic_step_cotangents, span_cotangents, step_at

    wrapped = gradscope.wrap(tiny(bare=limit is not None, **({} if limit is None else {"time_step_limit": limit})))
    core = wrapped.core
    gen = torch.Generator().manual_seed(13)
    for L in (1, 2, 5):
        x = torch.randn(B, L, HIDDEN, generator=gen, dtype=torch.float64)
        z = torch.randn(B, core.state_dim, generator=gen, dtype=torch.float64)
        gz = torch.randn(4, B, core.state_dim, generator=gen, dtype=torch.float64)
        rows, sq = span_cotangents(core, x, z, gz, sumsq_blocks)
        states = [z]
        for k in range(L - 1):
            states.append(step_at(core, x[:, k], states[-1], k)[1])
        ref = gz
        for k in range(L - 1, -1, -1):
            ref = generic_step_cotangents(core, x[:, k], states[k], ref)
            torch.testing.assert_close(sq[..., k], (ref ** 2).sum(-1), rtol=1e-12, atol=0, msg=f"step {k} of {L}")
        torch.testing.assert_close(rows, ref, rtol=1e-12, atol=1e-13)
        with monkeypatch.context() as mp:  # the fallback (states run forward, each step's own reverse) agrees
            mp.setattr(HFMamba2Core, "span_cotangents", None)
            rows_fb, sq_fb = span_cotangents(core, x, z, gz, sumsq_blocks)
        torch.testing.assert_close(rows_fb, ref, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(sq_fb, sq, rtol=1e-12, atol=0)
    with torch.no_grad():
        inputs = wrapped.core_inputs(tokens(8, length=7))
        prev = previous_states(core, inputs)
    monkeypatch.setattr(estimators, "FLOW_SPAN", 2)
    ours = flow_hutchinson(core, inputs, prev, probes=4, generator=torch.Generator().manual_seed(2))
    monkeypatch.setattr(HFMamba2Core, "span_cotangents", None)
    ref = flow_hutchinson(core, inputs, prev, probes=4, generator=torch.Generator().manual_seed(2))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-13, equal_nan=True)
    assert torch.isfinite(ours[0][:, :-1]).all()
