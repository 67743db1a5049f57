"""gradscope.wrap(transformers Qwen3NextForCausalLM / Qwen3NextModel): Gated DeltaNet layers, a gated attention
layer whose keys and values are part of the state, dense and MoE MLPs, against a float64 brute force through
transformers' own forward and cache (tests/helpers/adapterkit.py): the state Jacobian, the state's size,
S(A, A) = 1 and its invariance to a permutation of the state, the delta rule's exponents against a dense QR
of its full step Jacobian, and the CLI on a saved model directory (issue #49)."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import gradscope  # noqa: E402
from gradscope.errors import GradscopeError  # noqa: E402
from tests.helpers.adapterkit import (Family, check_declared_blocks, check_stability,  # noqa: E402
                                      check_state_jacobian, hybrid_family, probes)

B, T, V = 2, 7, 40
RTOL = 2e-6  # transformers runs its delta rule, RMSNorms and router in float32 even for a float64 model
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 16, 4, 2, 8
HV, HK, DK, DV, KERNEL = 4, 2, 4, 3, 3
TYPES = ["linear_attention", "full_attention", "linear_attention"]  # a hybrid: the attention layer in the middle


def config(**extra) -> "transformers.Qwen3NextConfig":  # noqa: ANN003
    base = dict(vocab_size=V, hidden_size=HIDDEN, intermediate_size=24, num_hidden_layers=len(TYPES),
                layer_types=TYPES, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                linear_num_value_heads=HV, linear_num_key_heads=HK, linear_key_head_dim=DK,
                linear_value_head_dim=DV, linear_conv_kernel_dim=KERNEL, num_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=8, shared_expert_intermediate_size=8, decoder_sparse_step=2,
                max_position_embeddings=64, experts_implementation="eager", attn_implementation="eager")
    base.update(extra)
    return transformers.Qwen3NextConfig(**base)


def tiny(bare: bool = False, **extra) -> torch.nn.Module:  # noqa: ANN003
    torch.manual_seed(0)
    cls = transformers.Qwen3NextModel if bare else transformers.Qwen3NextForCausalLM
    model = cls(config(**extra)).eval()
    with torch.no_grad():  # the default init leaves the (1 + w) norms at 1 and a zero router: make every term count
        gen = torch.Generator().manual_seed(10)
        for name, p in model.named_parameters():
            if "norm" in name and p.dim() == 1:
                p.normal_(0.0, 0.3, generator=gen)
            elif "experts" in name or "mlp.gate." in name:
                p.normal_(0.0, 0.3, generator=gen)
            elif "dt_bias" in name:
                p.normal_(0.0, 0.5, generator=gen)
    return model.double()


def _delta_parts(layer) -> list[torch.Tensor]:  # noqa: ANN001 - a cache layer
    """A Gated DeltaNet cache layer in the documented layout: the conv window without its oldest input, then the
    delta state transposed (H_v, d_v, d_k)."""
    return [layer.conv_states[0][:, :, 1:].double(), layer.recurrent_states[0].transpose(-1, -2).double()]


def _set_delta_parts(layer, parts) -> None:  # noqa: ANN001 - a cache layer and an iterator of parts
    window = next(parts)
    layer.conv_states[0] = torch.cat([torch.zeros_like(window[:, :, :1]), window], dim=-1)
    layer.recurrent_states[0] = next(parts).transpose(-1, -2).contiguous()


def family(model: torch.nn.Module, positions: int) -> Family:
    """Qwen3-Next's cache in the documented layout (tests/helpers/adapterkit.hybrid_family): per linear-attention
    layer the conv window and the transposed delta state; per attention layer its keys and values."""
    return hybrid_family(model, list(model.config.layer_types), positions, read_recurrent=_delta_parts,
                         write_recurrent=_set_delta_parts)


POSITIONS = 12


@pytest.fixture(scope="module")
def qwen():  # noqa: ANN201
    model = tiny()
    return model, gradscope.wrap(model, positions=POSITIONS), family(model, POSITIONS)


def tokens(seed: int, n: int = B, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (n, length), generator=torch.Generator().manual_seed(seed))


def test_wrap_runs_on_the_model_itself_with_the_configured_state() -> None:
    model = tiny()
    wrapped = gradscope.wrap(model, positions=POSITIONS)
    core = wrapped.core
    assert core.model is model.model and wrapped.readout is model.lm_head
    ours = {p.data_ptr() for p in wrapped.parameters()}
    assert all(p.data_ptr() in ours for p in model.parameters())  # the same tensors, no copies
    assert list(core.state_layout()) == ["l0/conv", "l0/delta", "l1/keys", "l1/values", "l2/conv", "l2/delta"]
    conv = 2 * HK * DK + HV * DV
    assert core.state_dim == 2 * (conv * (KERNEL - 1) + HV * DK * DV) + 2 * POSITIONS * KV_HEADS * HEAD_DIM
    held = [b.name for b in core.jacobian_structure().blocks if b.held]
    assert held == ["l1/keys", "l1/values"]
    with torch.no_grad():
        logits = model(input_ids=tokens(9), use_cache=False).logits
        assert float((wrapped(tokens(9)) - logits).abs().max()) < 1e-5 * max(1.0, float(logits.abs().max()))
    assert isinstance(model.model.layers[1].mlp, transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextSparseMoeBlock)


@pytest.mark.parametrize("p,method", [(1, "vjp"), (3, "func"), (T - 1, "auto")])
def test_state_jacobian_matches_the_library_cache(qwen, p: int, method: str) -> None:  # noqa: ANN001
    """J = ∂y_T/∂z_p, recurrent states and keys/values at positions ≤ p, equals the library's own, set in its
    cache at p and run token by token, one autograd row per output."""
    model, wrapped, fam = qwen
    check_state_jacobian(fam, wrapped, tokens(1), p, method, RTOL)


def test_stability_matches_the_library_is_one_with_itself_and_ignores_the_states_order(qwen) -> None:  # noqa: ANN001
    from gradscope.analysis.scores import default_score

    model, wrapped, fam = qwen
    check_stability(fam, wrapped, L=6, p=3, rtol=1e-6)
    jac = gradscope.state_jacobian(wrapped, tokens(5), position=3).jac
    same = default_score(jac, jac)
    assert torch.allclose(same, torch.ones_like(same), rtol=0, atol=1e-12)
    other = gradscope.state_jacobian(wrapped, tokens(6), position=3).jac
    perm = torch.randperm(jac.shape[-1], generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(default_score(jac[..., perm], other[..., perm]), default_score(jac, other),
                               rtol=1e-12, atol=1e-14)


def test_a_sequence_beyond_the_cache_is_refused_in_one_line(qwen) -> None:  # noqa: ANN001
    _, wrapped, _ = qwen
    with pytest.raises(GradscopeError, match="holds 12 positions") as err:
        gradscope.state_jacobian(wrapped, tokens(2, length=POSITIONS + 1), position=2)
    assert "\n" not in str(err.value)
    with pytest.raises(GradscopeError, match="no attention cache"):
        gradscope.wrap(transformers.MambaForCausalLM(transformers.MambaConfig(
            vocab_size=V, hidden_size=8, num_hidden_layers=1, state_size=2)).eval(), positions=8)


def test_the_delta_rules_exponents_equal_a_dense_qr_of_its_step_jacobian() -> None:
    """A Gated DeltaNet layer alone: the structured engine's exponents (each head's M_t's d_k × d_k cocycle, each
    d_v times, from one declared block a head) equal Benettin's QR of the delta state's full (d_k·d_v per head) step Jacobian from torch.func, which knows
    nothing of M_t ⊗ I; the conv window's are −∞. (The delta block alone: in a QR of the whole J_t the
    nilpotent conv columns die after K − 1 steps and leave their frame vectors free to take delta directions.)"""
    from gradscope.analysis.lyapunov import lyapunov_spectrum
    from gradscope.models.core import generic_step_jacobian, initial_state, step_at

    model = tiny(num_hidden_layers=1, layer_types=["linear_attention"])
    wrapped = gradscope.wrap(model)
    core = wrapped.core
    x = wrapped.core_inputs(tokens(3, n=1, length=80))
    warmup = 5
    heads = core.jacobian_structure().blocks[1:]
    assert [b.name for b in heads] == [f"l0/delta/h{j}" for j in range(HV)]
    assert all((b.form, b.size, b.repeat, b.width) == ("block_diagonal", DK, DV, DK * DV) for b in heads)
    own = core.state_layout()["l0/delta"]
    width = own.stop - own.start
    assert (own.start, width) == (heads[0].start, HV * DK * DV)
    with torch.no_grad():
        got = lyapunov_spectrum(core, x, warmup=warmup).exponents.reshape(-1)
        z = initial_state(core, 1, x)
        Q = torch.eye(width, dtype=torch.float64)[None]
        sums = torch.zeros(width, dtype=torch.float64)
        for t in range(x.shape[1]):
            J = generic_step_jacobian(core, x[:, t], z, t)[:, own, own]
            z = step_at(core, x[:, t], z, t)[1]
            if t < warmup:
                continue
            Q, R = torch.linalg.qr(J @ Q)
            sums += R[0].diagonal().abs().log()
        dense = (sums / (x.shape[1] - warmup)).sort(descending=True).values
    finite = got[torch.isfinite(got)].sort(descending=True).values
    assert finite.numel() == width  # the delta state's exponents; the conv window's are −∞
    assert int(torch.isneginf(got).sum()) == (2 * HK * DK + HV * DV) * (KERNEL - 1)
    torch.testing.assert_close(finite, dense, rtol=0, atol=0.05)  # a finite window: the frames' O(1/T) transients
    counts = torch.unique_consecutive(finite.round(decimals=8), return_counts=True)[1]
    assert bool((counts % DV == 0).all())  # each of M's exponents d_v times


def test_lyapunov_of_the_hybrid_holds_the_attention_cache_as_input(qwen) -> None:  # noqa: ANN001
    """The spectra are of the recurrent layers' states only: as many exponents as the non-held blocks'
    entries, equal to the structured engine's on the recurrent blocks."""
    from gradscope.analysis.lyapunov import lyapunov_spectrum

    _, wrapped, _ = qwen
    core = wrapped.core
    with torch.no_grad():
        res = lyapunov_spectrum(core, wrapped.core_inputs(tokens(4, n=1, length=POSITIONS)), warmup=2)
    recurrent = sum(b.width for b in core.jacobian_structure().blocks if not b.held)
    assert res.exponents.shape[-1] == recurrent
    assert int(torch.isfinite(res.exponents).sum()) == 2 * HV * DK * DV


def test_the_bare_model_and_dense_mlps() -> None:
    bare = tiny(bare=True, num_experts=0)
    wrapped = gradscope.wrap(bare, positions=POSITIONS)
    assert wrapped.readout is None
    check_state_jacobian(family(bare, POSITIONS), wrapped, tokens(4), 2, "vjp", RTOL)


def test_cli_stability_on_a_saved_directory(runner, tmp_path) -> None:  # noqa: ANN001
    import numpy as np
    import xarray as xr

    from gradscope.cli.app import app

    model = tiny().float()
    model.save_pretrained(tmp_path / "q3n")
    assert json.loads((tmp_path / "q3n" / "config.json").read_text())["architectures"] == ["Qwen3NextForCausalLM"]
    from gradscope.models.adapters.load import load_hf

    loaded = load_hf("hf", tmp_path / "q3n")  # the experts, saved one by one, fused back as the model holds them
    want = model.state_dict()
    assert set(loaded.state_dict()) == set(want)
    assert all(torch.equal(v, want[k]) for k, v in loaded.state_dict().items())
    probes_file = tmp_path / "p.npy"
    np.save(probes_file, probes(V, 3, 6, 2, seed=6).numpy())
    out = tmp_path / "s.zarr"
    result = runner.invoke(app, ["stability", str(tmp_path / "q3n"), "--model-factory", "hf", "--probes",
                                 str(probes_file), "--target-pos", "2", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.stderr
    ds = xr.open_zarr(out)
    assert np.isfinite(ds["score_default"].values).all()


def test_dynamics_of_the_hybrid_from_the_cli(runner, tmp_path) -> None:  # noqa: ANN001
    """dynamics on a saved Qwen3-Next directory: flow and grid on the whole state, step spectra, gates and
    Lyapunov on the recurrent layers' states with the caches held; the table and the store say which."""
    import xarray as xr

    from gradscope.cli.app import app

    tiny().float().save_pretrained(tmp_path / "q3n")
    dyn = tmp_path / "d.zarr"
    result = runner.invoke(app, ["dynamics", str(tmp_path / "q3n"), "--model-factory", "hf", "--sequences", "2",
                                 "--length", "8", "--steps", "40", "--trajectories", "2", "-o", str(dyn)])
    assert result.exit_code == 0, result.stderr
    assert "held" in result.stdout and "l1/keys" in result.stdout
    ds = xr.open_zarr(dyn)
    assert ds.attrs["held"] == "l1/keys, l1/values"
    recurrent = 2 * ((2 * HK * DK + HV * DV) * (KERNEL - 1) + HV * DK * DV)
    assert ds.sizes["exponent"] == recurrent


def test_the_declared_blocks_are_the_step_jacobians_own_and_it_is_lower_triangular(qwen) -> None:  # noqa: ANN001
    """At every step, J_t from torch.func (the whole matrix) restricted to each declared block equals the
    block the adapter gives (each head's M_t repeated d_v times, the conv shift, the caches' 1s with 0 at slot
    t), and no block reads a later one."""
    _, wrapped, _ = qwen
    check_declared_blocks(wrapped.core, wrapped.core_inputs(tokens(12, n=2, length=4)), steps=4)


@pytest.mark.parametrize("t", [0, 3, POSITIONS - 1])
def test_hand_derived_step_products_equal_torch_func(qwen, t: int) -> None:  # noqa: ANN001
    """step_tangents (delta rule, gated attention over the cache, dense MLP and MoE) against torch.func's jvp of
    the step, in float64 to 1e-12, at a state the scan reached (caches filled up to t); also written into
    given buffers (NaN-filled, so an entry left unwritten fails)."""
    from gradscope.models.core import generic_step_tangents, initial_state, step_at, step_tangents

    _, wrapped, _ = qwen
    core = wrapped.core
    x = wrapped.core_inputs(tokens(13, n=2, length=POSITIONS))
    with torch.no_grad():
        z = initial_state(core, 2, x)
        for s in range(t):
            z = step_at(core, x[:, s], z, s)[1]
        dz = torch.randn(3, *z.shape, generator=torch.Generator().manual_seed(t), dtype=z.dtype)
        ref = generic_step_tangents(core, x[:, t], z, dz, t)
        ours = step_tangents(core, x[:, t], z, dz, t)
        out = (torch.full_like(z, float("nan")), torch.full_like(dz, float("nan")))
        into = step_tangents(core, x[:, t], z, dz, t, out=out)
    for a, b, c in zip(ours, ref, into, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(c, b, rtol=1e-12, atol=1e-13)
    assert into[1] is out[0] and into[3] is out[1]


@pytest.mark.parametrize("start,length", [(0, 5), (4, 8)])
def test_a_span_layer_by_layer_equals_torch_funcs_chained_steps(qwen, start: int, length: int) -> None:  # noqa: ANN001
    """chain_tangents (layer by layer over the span: batched projections, the delta recurrence and attention's
    causal mask inside) against torch.func's jvp steps chained, in float64, from a state the scan reached."""
    from gradscope.models.core import chain_tangents, generic_step_tangents, initial_state, step_at

    _, wrapped, _ = qwen
    core = wrapped.core
    x = wrapped.core_inputs(tokens(14, n=2, length=POSITIONS))
    with torch.no_grad():
        z = initial_state(core, 2, x)
        for s in range(start):
            z = step_at(core, x[:, s], z, s)[1]
        dz = torch.randn(3, *z.shape, generator=torch.Generator().manual_seed(start), dtype=z.dtype)
        y, dy = chain_tangents(core, x[:, start:start + length], z, dz, start)
        zr, dzr = z, dz
        for s in range(start, start + length):
            yr, zr, dyr, dzr = generic_step_tangents(core, x[:, s], zr, dzr, s)
    torch.testing.assert_close(y, yr, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(dy, dyr, rtol=1e-11, atol=1e-12)


def test_the_recurrent_view_forwards_the_hand_derived_products(qwen) -> None:  # noqa: ANN001
    """The recurrent view of a core with its own step_tangents has them too (the inner core's, on the full state
    with zero tangents on the caches, restricted), equal to torch.func on the view in float64; a view of a core
    without them has none (the plans price it as generic)."""
    from gradscope.analysis.held import recurrent_view
    from gradscope.models.core import generic_step_tangents, initial_state, own_products, step_at, step_tangents

    _, wrapped, _ = qwen
    x = wrapped.core_inputs(tokens(15, n=2, length=POSITIONS))
    view, xv = recurrent_view(wrapped.core, x)
    assert "jvp" in own_products(view)
    with torch.no_grad():
        z = initial_state(view, 2, xv)
        for s in range(5):
            z = step_at(view, xv[:, s], z, s)[1]
        dz = torch.randn(3, *z.shape, generator=torch.Generator().manual_seed(5), dtype=z.dtype)
        for a, b in zip(step_tangents(view, xv[:, 5], z, dz, 5), generic_step_tangents(view, xv[:, 5], z, dz, 5),
                        strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    bamba = transformers.BambaForCausalLM(transformers.BambaConfig(
        vocab_size=V, hidden_size=16, num_hidden_layers=2, attn_layer_indices=[1], mamba_n_heads=2, mamba_d_head=16,
        mamba_n_groups=1, mamba_d_state=4, mamba_expand=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=16)).eval()
    plain = gradscope.wrap(bamba, positions=4)  # fewer slots than the wrap-time check's 6 tokens: it reads 4
    assert "jvp" not in own_products(recurrent_view(plain.core, plain.core_inputs(tokens(2, length=4)))[0])
