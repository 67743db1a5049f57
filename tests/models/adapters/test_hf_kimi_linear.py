"""gradscope.wrap(transformers KimiLinearForCausalLM / KimiLinearModel): Kimi Delta Attention layers, a multi-head
latent attention layer whose cached latents are part of the state, dense and MoE MLPs, against a float64 brute
force through transformers' own forward and cache (tests/helpers/adapterkit.py): the state Jacobian, the state's
size, S(A, A) = 1 and its invariance to a permutation of the state, the declared blocks against torch.func's J_t,
KDA's exponents against a dense QR of its full step Jacobian, and the grouped router against the library's."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import gradscope  # noqa: E402
from gradscope.errors import GradscopeError  # noqa: E402
from tests.helpers.adapterkit import (Family, check_declared_blocks, check_held_spectrum,  # noqa: E402
                                      check_stability, check_state_jacobian, hybrid_family)

B, T, V = 2, 7, 40
RTOL = 2e-6  # transformers runs its delta rule, gate, RMSNorms, router and softmax in float32 even for float64
HIDDEN, HEADS, LATENT, ROPE, NOPE, VDIM = 16, 2, 6, 2, 4, 3
H, D, KERNEL = 2, 4, 3  # KDA heads, their head dim (keys and values), conv taps
TYPES = ["linear_attention", "full_attention", "linear_attention"]  # a hybrid: the MLA layer in the middle
POSITIONS = 12


def config(**extra) -> "transformers.KimiLinearConfig":  # noqa: ANN003
    n = len(extra.get("layer_types", TYPES))
    base = dict(vocab_size=V, hidden_size=HIDDEN, intermediate_size=24, moe_intermediate_size=8,
                num_hidden_layers=n, layer_types=TYPES, mlp_layer_types=["dense"] + ["sparse"] * (n - 1),
                num_attention_heads=HEADS, num_key_value_heads=HEADS, kv_lora_rank=LATENT, q_lora_rank=None,
                qk_rope_head_dim=ROPE, qk_nope_head_dim=NOPE, v_head_dim=VDIM, num_local_experts=6,
                num_experts_per_tok=2, n_group=3, topk_group=2, linear_head_dim=D, linear_num_heads=H,
                linear_conv_kernel_dim=KERNEL, initializer_range=0.2,
                pad_token_id=None, bos_token_id=None, eos_token_id=None,  # the defaults (163839, …) exceed V
                experts_implementation="eager", attn_implementation="eager")
    base.update(extra)
    return transformers.KimiLinearConfig(**base)


def tiny(bare: bool = False, **extra) -> torch.nn.Module:  # noqa: ANN003
    torch.manual_seed(0)
    cls = transformers.KimiLinearModel if bare else transformers.KimiLinearForCausalLM
    model = cls(config(**extra)).eval()
    with torch.no_grad():  # the default init leaves norms at 1, a zero score bias and decays near 0: make every term count
        gen = torch.Generator().manual_seed(10)
        for name, p in model.named_parameters():
            if "norm" in name and p.dim() == 1:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif "experts" in name or "mlp.gate." in name:
                p.normal_(0.0, 0.3, generator=gen)
            elif "dt_bias" in name:
                p.normal_(0.0, 0.5, generator=gen)
            elif "A_log" in name:
                p.normal_(-1.0, 0.5, generator=gen)
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.normal_(0.0, 0.2, generator=gen)
    return model.double()


def _delta_parts(layer) -> list[torch.Tensor]:  # noqa: ANN001 - a cache layer
    """A KDA cache layer in the documented layout: the conv window without its oldest input, then the delta state
    transposed (H, d_v, d_k)."""
    return [layer.conv_states[0][:, :, 1:].double(), layer.recurrent_states[0].transpose(-1, -2).double()]


def _set_delta_parts(layer, parts) -> None:  # noqa: ANN001 - a cache layer and an iterator of parts
    window = next(parts)
    layer.conv_states[0] = torch.cat([torch.zeros_like(window[:, :, :1]), window], dim=-1)
    layer.recurrent_states[0] = next(parts).transpose(-1, -2).contiguous()


def family(model: torch.nn.Module, positions: int) -> Family:
    """Kimi Linear's cache in the documented layout (adapterkit.hybrid_family): per KDA layer the conv window and
    the transposed delta state; per MLA layer its cache layer's ``keys`` (the latent) and ``values`` (the shared
    key part), (positions, 1, width) each."""
    return hybrid_family(model, list(model.config.layer_types), positions, read_recurrent=_delta_parts,
                         write_recurrent=_set_delta_parts)


@pytest.fixture(scope="module")
def kimi():  # noqa: ANN201
    model = tiny()
    return model, gradscope.wrap(model, positions=POSITIONS), family(model, POSITIONS)


def tokens(seed: int, n: int = B, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (n, length), generator=torch.Generator().manual_seed(seed))


def test_wrap_runs_on_the_model_itself_with_the_configured_state(kimi) -> None:  # noqa: ANN001
    model, wrapped, _ = kimi
    core = wrapped.core
    assert core.model is model.model and wrapped.readout is model.lm_head
    ours = {p.data_ptr() for p in wrapped.parameters()}
    assert all(p.data_ptr() in ours for p in model.parameters())  # the same tensors, no copies
    assert list(core.state_layout()) == ["l0/conv", "l0/delta", "l1/keys", "l1/values", "l2/conv", "l2/delta"]
    conv = 3 * H * D
    assert core.state_dim == 2 * (conv * (KERNEL - 1) + H * D * D) + POSITIONS * (LATENT + ROPE)
    held = [b.name for b in core.jacobian_structure().blocks if b.held]
    assert held == ["l1/keys", "l1/values"]
    with torch.no_grad():
        logits = model(input_ids=tokens(9), use_cache=False).logits
        assert float(logits.std()) > 0.3  # not a near-constant model
        assert float((wrapped(tokens(9)) - logits).abs().max()) < 1e-5 * max(1.0, float(logits.abs().max()))
    assert type(model.model.layers[1].mlp).__name__ == "KimiLinearMoE"


@pytest.mark.parametrize("p,method", [(1, "vjp"), (3, "func"), (T - 1, "auto")])
def test_state_jacobian_matches_the_library_cache(kimi, p: int, method: str) -> None:  # noqa: ANN001
    """J = ∂y_T/∂z_p, recurrent states and cached latents at positions ≤ p, equals the library's own, set in its
    cache at p and run token by token, one autograd row per output."""
    _, wrapped, fam = kimi
    check_state_jacobian(fam, wrapped, tokens(1), p, method, RTOL)


def test_with_the_librarys_float32_rounding_lifted_the_jacobian_agrees_to_float64(kimi, monkeypatch) -> None:  # noqa: ANN001
    """RTOL is float32 rounding alone: with the library's casts to float32 (``torch.float32`` in its module and
    ``Tensor.float``, in the gate, norms, router, softmax and delta rule) turned into float64, J equals the
    library's to 1e-12. Forward mode: in float64 the library's cast no longer copies its recurrent state, which
    its cache then writes in place over a tensor reverse mode saved."""
    import types

    from transformers.models.kimi_linear import modeling_kimi_linear as library

    class Float64(types.ModuleType):
        def __getattr__(self, name: str):  # noqa: ANN204
            return torch.float64 if name == "float32" else getattr(torch, name)

    monkeypatch.setattr(library, "torch", Float64("torch"))
    monkeypatch.setattr(torch.Tensor, "float", lambda self, *args, **kwargs: self.double())
    model, wrapped, _ = kimi
    fam = family(model, POSITIONS)
    fam.reverse = False
    check_state_jacobian(fam, wrapped, tokens(1), 3, "func", 1e-12)


def test_stability_matches_the_library_is_one_with_itself_and_ignores_the_states_order(kimi) -> None:  # noqa: ANN001
    from gradscope.analysis.scores import default_score

    _, wrapped, fam = kimi
    check_stability(fam, wrapped, L=6, p=3, rtol=1e-6)
    jac = gradscope.state_jacobian(wrapped, tokens(5), position=3).jac
    same = default_score(jac, jac)
    assert torch.allclose(same, torch.ones_like(same), rtol=0, atol=1e-12)
    other = gradscope.state_jacobian(wrapped, tokens(6), position=3).jac
    perm = torch.randperm(jac.shape[-1], generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(default_score(jac[..., perm], other[..., perm]), default_score(jac, other),
                               rtol=1e-12, atol=1e-14)


def test_a_sequence_beyond_the_cache_and_unbuilt_variants_are_refused_in_one_line(kimi) -> None:  # noqa: ANN001
    _, wrapped, _ = kimi
    with pytest.raises(GradscopeError, match="holds 12 positions") as err:
        gradscope.state_jacobian(wrapped, tokens(2, length=POSITIONS + 1), position=2)
    assert "\n" not in str(err.value)
    for extra, match in (({"hidden_act": "gelu"}, "hidden_act"), ({"num_key_value_heads": 1}, "num_key_value_heads"),
                         ({"n_group": 6, "topk_group": 2}, "n_group")):
        with pytest.raises(GradscopeError, match=match) as err:
            gradscope.wrap(tiny(**extra), positions=4)
        assert "\n" not in str(err.value)


def test_the_router_and_experts_equal_the_librarys_moe() -> None:
    """kimi_moe (grouped sigmoid routing with the score correction bias, renormalised and scaled top-k, shared
    experts) against the library's own KimiLinearMoE on random tokens, where the group limit and the bias both
    change which experts are chosen."""
    from gradscope.models.adapters.hf_kimi_linear import kimi_moe

    moe = tiny().model.layers[1].mlp
    x = torch.randn(64, HIDDEN, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with torch.no_grad():
        ref = moe(x[:, None])[:, 0]
        torch.testing.assert_close(kimi_moe(moe, x), ref, rtol=1e-6, atol=1e-6)  # the library routes in float32
        router = moe.gate
        scores = torch.sigmoid(x @ router.weight.T)
        plain = torch.topk(scores, router.top_k, dim=-1)[1].sort(-1).values
        chosen = router(x)[2].sort(-1).values
        assert not torch.equal(plain, chosen)  # the test sees the groups and the bias at work


def test_the_kda_exponents_equal_a_dense_qr_of_its_step_jacobian() -> None:
    """A KDA layer alone: the structured engine's exponents (each head's M_t = (I − β k kᵀ) Diag(α) d_k × d_k
    cocycle, each d_v times, from one declared block a head) equal Benettin's QR of the delta state's full
    (d_k·d_v per head) step Jacobian from torch.func, which knows nothing of M_t ⊗ I; the conv window's are −∞.
    (The delta block alone: in a QR of the whole J_t the nilpotent conv columns die after K − 1 steps and leave
    their frame vectors free to take delta directions.)"""
    from gradscope.analysis.lyapunov import lyapunov_spectrum
    from gradscope.models.core import generic_step_jacobian, initial_state, step_at

    model = tiny(layer_types=["linear_attention"])
    wrapped = gradscope.wrap(model)
    core = wrapped.core
    x = wrapped.core_inputs(tokens(3, n=1, length=80))
    warmup = 5
    heads = core.jacobian_structure().blocks[1:]
    assert [b.name for b in heads] == [f"l0/delta/h{j}" for j in range(H)]
    assert all((b.form, b.size, b.repeat, b.width) == ("block_diagonal", D, D, D * D) for b in heads)
    own = core.state_layout()["l0/delta"]
    width = own.stop - own.start
    assert (own.start, width) == (heads[0].start, H * D * D)
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
    assert int(torch.isneginf(got).sum()) == 3 * H * D * (KERNEL - 1)
    assert float(finite[0] - finite[-1]) > 0.5  # per-channel decays: a head's exponents are not one value
    torch.testing.assert_close(finite, dense, rtol=0, atol=0.05)  # a finite window: the frames' O(1/T) transients
    counts = torch.unique_consecutive(finite.round(decimals=8), return_counts=True)[1]
    assert bool((counts % D == 0).all())  # each of M's exponents d_v times


def test_the_declared_blocks_are_the_step_jacobians_own_and_the_held_spectrum(kimi) -> None:  # noqa: ANN001
    """At every step, J_t from torch.func restricted to each declared block equals the block the adapter gives
    (each head's M_t repeated d_v times, the conv shift, the caches' 1s with 0 at slot t), no block reads a later
    one, and the Lyapunov spectrum with the latent cache held has the recurrent entries only."""
    _, wrapped, _ = kimi
    check_declared_blocks(wrapped.core, wrapped.core_inputs(tokens(12, n=2, length=4)), steps=4)
    check_held_spectrum(wrapped.core, wrapped.core_inputs(tokens(4, n=1, length=POSITIONS)),
                        finite=2 * H * D * D, minus_inf=2 * 3 * H * D * (KERNEL - 1))


def test_the_bare_model_with_dense_mlps_and_a_low_rank_query() -> None:
    bare = tiny(bare=True, mlp_layer_types=["dense"] * len(TYPES), q_lora_rank=5)
    assert bare.layers[1].self_attn.q_a_proj is not None
    wrapped = gradscope.wrap(bare, positions=POSITIONS)
    assert wrapped.readout is None
    check_state_jacobian(family(bare, POSITIONS), wrapped, tokens(4), 2, "vjp", RTOL)
