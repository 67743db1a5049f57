"""gradscope.wrap(transformers MambaForCausalLM / FalconMambaForCausalLM) against a float64 brute force
through transformers' own forward and cache (tests/helpers/adapterkit.py), and the CLI on a saved model directory."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import gradscope  # noqa: E402
from tests.helpers.adapterkit import (Family, check_changed_mixer_refused, check_gradient_flow,  # noqa: E402
                                      check_lyapunov_sum, check_own_step_tangents, check_stability,
                                      check_state_jacobian,
                                      conv_cache_family, probes)


B, T, V = 3, 6, 20
RTOL = 2e-6  # transformers rounds its SSM scan and norms to float32 even in float64


def tiny(falcon: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    cls, cfg_cls = ((transformers.FalconMambaForCausalLM, transformers.FalconMambaConfig) if falcon
                    else (transformers.MambaForCausalLM, transformers.MambaConfig))
    cfg = cfg_cls(vocab_size=V, hidden_size=8, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=3,
                  time_step_rank=2, use_bias=True)
    model = cls(cfg).eval().double()
    with torch.no_grad():  # the default init leaves D = 1 and zero biases: make every term count
        for layer in model.backbone.layers:
            layer.mixer.D.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(2))
            layer.mixer.conv1d.bias.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(3))
            layer.norm.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(4))
    return model


def family(model: torch.nn.Module) -> Family:
    """Mamba's cache in the documented layout (tests/helpers/adapterkit.conv_cache_family)."""
    return conv_cache_family(model)


@pytest.fixture(scope="module")
def mamba():  # noqa: ANN201
    model = tiny()
    return model, gradscope.wrap(model), family(model)


def tokens(seed: int, n: int = B, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (n, length), generator=torch.Generator().manual_seed(seed))


def test_wrap_runs_on_the_model_itself(mamba) -> None:  # noqa: ANN001
    model, wrapped, _ = mamba
    core = wrapped.core
    assert core.model is model.backbone and wrapped.readout is model.lm_head
    assert wrapped.inputs.embedding is model.backbone.embeddings
    ours = {p.data_ptr() for p in wrapped.parameters()}
    assert all(p.data_ptr() in ours for p in model.parameters())  # the same tensors, no copies
    assert list(core.state_layout()) == ["l0/conv", "l0/ssm", "l1/conv", "l1/ssm"]
    assert core.state_dim == 2 * 16 * (2 + 4)
    assert wrapped.library_error < 1e-6
    with torch.no_grad():
        logits = model(input_ids=tokens(9), use_cache=False).logits
        assert float((wrapped(tokens(9)) - logits).abs().max()) < 1e-5


@pytest.mark.parametrize("p,method", [(1, "vjp"), (3, "func"), (T - 1, "auto")])
def test_state_jacobian_matches_the_library(mamba, p: int, method: str) -> None:  # noqa: ANN001
    model, wrapped, fam = mamba
    check_state_jacobian(fam, wrapped, tokens(1), p, method, RTOL)


def test_stability_gradient_flow_and_lyapunov_sum(mamba) -> None:  # noqa: ANN001
    model, wrapped, fam = mamba
    check_stability(fam, wrapped, L=5, p=2, rtol=1e-6)
    check_gradient_flow(fam, wrapped, tokens(2, n=2), rtol=RTOL)
    check_lyapunov_sum(fam, wrapped, tokens(3, n=2, length=10), warmup=2, atol=1e-6)


def test_falcon_mamba_shares_the_adapter() -> None:
    model = tiny(falcon=True)
    wrapped = gradscope.wrap(model)
    assert wrapped.core.falcon and wrapped.library_error < 1e-6
    check_state_jacobian(family(model), wrapped, tokens(4), 2, "vjp", RTOL)


def test_a_changed_mixer_is_refused() -> None:
    check_changed_mixer_refused(tiny())


def test_cli_stability_and_dynamics_on_a_saved_directory(runner, tmp_path) -> None:  # noqa: ANN001
    import numpy as np
    import xarray as xr

    from gradscope.cli.app import app

    model = tiny().float()
    model.save_pretrained(tmp_path / "mamba")
    assert json.loads((tmp_path / "mamba" / "config.json").read_text())["architectures"] == ["MambaForCausalLM"]
    probes_file = tmp_path / "p.npy"
    tok = probes(V, 3, 6, 2, seed=6)
    np.save(probes_file, tok.numpy())
    out = tmp_path / "s.zarr"
    result = runner.invoke(app, ["stability", str(tmp_path / "mamba"), "--model-factory", "hf", "--probes",
                                 str(probes_file), "--target-pos", "2", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.stderr
    ds = xr.open_zarr(out, consolidated=False).load()
    loaded = transformers.MambaForCausalLM.from_pretrained(tmp_path / "mamba", local_files_only=True).eval()
    ref = gradscope.stability(gradscope.wrap(loaded), probes=tok, target_pos=2)  # the Python API on the same files
    np.testing.assert_allclose(ds["score_default"].values, ref["score_default"].values, rtol=0, atol=1e-6)
    assert np.isfinite(ds["score_default"].values).all()
    assert "MambaForCausalLM" in ds.attrs["model_config"]
    result = runner.invoke(app, ["stability", str(tmp_path / "mamba" / "model.safetensors"), "--model",
                                 "hf:MambaForCausalLM", "--config", str(tmp_path / "mamba" / "config.json"),
                                 "--probes", str(probes_file), "--target-pos", "2", "-o", str(tmp_path / "w.zarr"), "-q"])
    assert result.exit_code == 0, result.stderr  # a weights file and its config: the same scores
    ws = xr.open_zarr(tmp_path / "w.zarr", consolidated=False).load()
    np.testing.assert_allclose(ws["score_default"].values, ref["score_default"].values, rtol=0, atol=1e-6)
    out = tmp_path / "d.zarr"
    result = runner.invoke(app, ["dynamics", str(tmp_path / "mamba"), "--model-factory", "hf:MambaForCausalLM",
                                 "--parts", "flow,lyapunov", "--sequences", "2", "--length", "5",
                                 "--trajectories", "1", "--steps", "20", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.stderr
    ds = xr.open_zarr(out, consolidated=False).load()
    from rich.console import Console

    from gradscope.cli.dynamics import dynamics_table
    console = Console(record=True, width=300)
    console.print(dynamics_table(ds))  # no readout from the state: the flow ratio ends at z_{T−1}, not nan
    shown = console.export_text()
    assert "|dy_T/dz_1| / |dy_T/dz_T−1|" in shown and " nan " not in shown.split("\n")[3], shown
    lam = ds["lyapunov"].values[0, 0]
    assert np.isneginf(lam).sum() == 2 * 16 * 2  # every conv-window exponent is −∞ (a shift register)
    assert np.isfinite(lam).sum() == 2 * 16 * 4
    bad = runner.invoke(app, ["dynamics", str(tmp_path / "mamba"), "--model-factory", "hf:NoSuchModel",
                              "-o", str(tmp_path / "x.zarr")])
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1 and "NoSuchModel" in bad.stderr


def _step_point(core: torch.nn.Module, rows: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """A step's input x (B, 8), state z (B, D) and ``rows`` tangent or cotangent rows (rows, B, D), float64."""
    x = torch.randn(B, 8, generator=gen, dtype=torch.float64)
    z = torch.randn(B, core.state_dim, generator=gen, dtype=torch.float64)
    return x, z, torch.randn(rows, B, core.state_dim, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("falcon", [False, True])
def test_hand_derived_step_tangents_equal_torch_func(falcon: bool, monkeypatch) -> None:  # noqa: ANN001
    """The adapter's own forward-mode step (what the stability sketch runs at real size) against
    ``vmap(jvp)`` of its step, in float64: one step, into given buffers, and a whole chain (J V of
    jvp_products against the exact J from the reverse engine)."""
    from gradscope.analysis.jacobian import jvp_products, state_jacobian
    from gradscope.models.adapters.hf_mamba import HFMambaCore

    wrapped = gradscope.wrap(tiny(falcon))
    core = wrapped.core
    gen = torch.Generator().manual_seed(7)
    x, z, dz = _step_point(core, 4, gen)
    check_own_step_tangents(core, x, z, dz)
    seq = tokens(5)
    V = torch.randn(B, 3, core.state_dim, generator=gen, dtype=torch.float64)
    _, P = jvp_products(wrapped, seq, 2, V)
    J = state_jacobian(wrapped, seq, 2).jac  # (B, H, D), exact
    torch.testing.assert_close(P, J @ V.transpose(1, 2), rtol=1e-10, atol=1e-12)
    monkeypatch.setattr(HFMambaCore, "step_tangents", None)  # the generic chain gives the same products
    torch.testing.assert_close(jvp_products(wrapped, seq, 2, V)[1], P, rtol=1e-12, atol=1e-13)


def test_step_tangents_of_another_activation_go_the_generic_way() -> None:
    from gradscope.models.core import generic_step_tangents, step_tangents

    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=V, hidden_size=8, state_size=4, num_hidden_layers=2, expand=2,
                                   conv_kernel=3, time_step_rank=2, hidden_act="gelu")
    core = gradscope.wrap(transformers.MambaForCausalLM(cfg).eval().double()).core
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(B, 8, generator=gen, dtype=torch.float64)
    z = torch.randn(B, core.state_dim, generator=gen, dtype=torch.float64)
    dz = torch.randn(2, B, core.state_dim, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        for a, b in zip(step_tangents(core, x, z, dz), generic_step_tangents(core, x, z, dz)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    silu = gradscope.wrap(tiny()).core  # a SiLU config whose mixer's act module was replaced: generic too
    silu.model.layers[1].mixer.act = torch.nn.Tanh()
    assert not silu._silu()
    z = torch.randn(B, silu.state_dim, generator=gen, dtype=torch.float64)
    dz = torch.randn(2, B, silu.state_dim, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        for a, b in zip(step_tangents(silu, x, z, dz), generic_step_tangents(silu, x, z, dz)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("falcon", [False, True])
def test_hand_derived_step_cotangents_equal_torch_func(falcon: bool, monkeypatch) -> None:  # noqa: ANN001
    """The adapter's own reverse step (the estimated gradient flow's chain at real size) against
    ``torch.func.vjp`` of its step in float64, and the estimated flow with and without it."""
    from gradscope.analysis.estimators import flow_hutchinson
    from gradscope.models.adapters.hf_mamba import HFMambaCore
    from gradscope.analysis.dynamics import previous_states
    from gradscope.models.core import generic_step_cotangents, step_cotangents

    wrapped = gradscope.wrap(tiny(falcon))
    core = wrapped.core
    gen = torch.Generator().manual_seed(9)
    x, z, gz = _step_point(core, 5, gen)
    torch.testing.assert_close(step_cotangents(core, x, z, gz), generic_step_cotangents(core, x, z, gz),
                               rtol=1e-12, atol=1e-13)
    with torch.no_grad():
        inputs = wrapped.core_inputs(tokens(6))
        prev = previous_states(core, inputs)
    ours = flow_hutchinson(core, inputs, prev, probes=4, generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(HFMambaCore, "step_cotangents", None)
    ref = flow_hutchinson(core, inputs, prev, probes=4, generator=torch.Generator().manual_seed(1))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13, equal_nan=True)
    assert torch.isfinite(ours[0][:, :-1]).all()


def test_unpacking_the_state_joins_its_gradients_once(mamba) -> None:  # noqa: ANN001
    """A reverse product through the adapter's state makes one gradient of z's width, not one per entry:
    unpack is one split (its backward joins the pieces), never a slice per entry (whose backward writes each
    piece's gradient into zeros of the full width: 5.4 GB at D = 58,368 in a user's run; bench/vjp_memory.py)."""
    core = mamba[1].core
    z = torch.randn(2, core.state_dim, requires_grad=True)
    parts = core.unpack(z)
    assert len(parts) == len(core.entries) >= 2
    roots = set()
    for part in parts.values():
        fn = part.grad_fn
        while fn is not None and "Split" not in type(fn).__name__ and fn.next_functions:
            fn = fn.next_functions[0][0]
        roots.add(type(fn).__name__)
    assert len(roots) == 1 and "Split" in roots.pop()
    grads = torch.autograd.grad(sum(p.sum() * (k + 1) for k, p in enumerate(parts.values())), z)[0]
    widths = [e.width for e in core.entries]
    expected = torch.cat([torch.full((2, w), float(k + 1)) for k, w in enumerate(widths)], dim=1)
    torch.testing.assert_close(grads, expected, rtol=0, atol=0)  # exact: sums of small integers
