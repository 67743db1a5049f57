"""gradscope.wrap(transformers JambaForCausalLM / JambaModel): Mamba-1 layers with Jamba's Δ/B/C norms, an attention
layer (no positional embedding) whose keys and values are part of the state, dense and mixture-of-experts MLPs,
against a float64 brute force through transformers' own forward and cache (tests/helpers/adapterkit.py):
J = ∂y_T/∂z_p, the state's size, S(A, A) = 1, the declared blocks against torch.func's J_t, the Mamba layers'
exponents with the cache held, and the MoE against the library's own block (softmax, top-k, no renormalisation)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import gradscope  # noqa: E402
from gradscope.errors import GradscopeError  # noqa: E402
from gradscope.models.adapters.hf_jamba import jamba_moe  # noqa: E402
from tests.helpers.adapterkit import (Family, check_held_spectrum, check_hybrid,  # noqa: E402
                                      check_state_jacobian, hybrid_family)

B, T, V, POSITIONS = 2, 6, 30, 10
RTOL = 2e-6  # transformers runs its SSM update, RMSNorms, router softmax and attention softmax in float32
HIDDEN, STATE, KERNEL, EXPERTS, TOP_K = 16, 4, 3, 4, 2
INNER = 2 * HIDDEN  # mamba_expand · hidden
HEADS, KV_HEADS = 4, 2
HEAD_DIM = HIDDEN // HEADS
# attention at i % 3 == 1 and experts at i % 2 == 1: Mamba (dense), attention (MoE), Mamba (dense), Mamba (MoE),
# so a Mamba layer reads the attention layer's output and both kinds carry an MoE
TYPES = ["linear_attention", "full_attention", "linear_attention", "linear_attention"]
MAMBA = 3


def config(**extra) -> "transformers.JambaConfig":  # noqa: ANN003
    base = dict(vocab_size=V, hidden_size=HIDDEN, num_hidden_layers=len(TYPES), attn_layer_period=3,
                attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=EXPERTS,
                num_experts_per_tok=TOP_K, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                intermediate_size=24, mamba_d_state=STATE, mamba_d_conv=KERNEL, mamba_expand=2, mamba_dt_rank=2,
                attn_implementation="eager", experts_implementation="eager")
    base.update(extra)
    return transformers.JambaConfig(**base)


def tiny(bare: bool = False, **extra) -> torch.nn.Module:  # noqa: ANN003
    torch.manual_seed(0)
    model = (transformers.JambaModel if bare else transformers.JambaForCausalLM)(config(**extra)).eval()
    with torch.no_grad():  # the default init leaves norms at 1, D at 1 and a near-uniform router: make every term count
        gen = torch.Generator().manual_seed(10)
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".D"):
                p.uniform_(0.5, 1.5, generator=gen)
            elif "conv1d.bias" in name or "dt_proj.bias" in name:
                p.normal_(0.0, 0.5, generator=gen)
            elif "router" in name:
                p.normal_(0.0, 0.3, generator=gen)
            elif "experts" in name:
                p.normal_(0.0, 0.3, generator=gen)
    return model.double()


def family(model: torch.nn.Module) -> Family:
    """Jamba's cache in the documented layout (tests/helpers/adapterkit.hybrid_family): per Mamba layer the conv
    window without its oldest input (never read) and the SSM state; per attention layer its keys and values; J by
    reverse mode, one autograd row per output."""
    return hybrid_family(model, TYPES, POSITIONS)


def tokens(seed: int, n: int = B, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (n, length), generator=torch.Generator().manual_seed(seed))


def test_state_jacobian_and_scores_match_the_library_cache() -> None:
    model = tiny()
    assert list(model.config.layer_types) == TYPES and list(model.config.layers_num_experts) == [1, EXPERTS, 1, EXPERTS]
    wrapped = gradscope.wrap(model, positions=POSITIONS)
    core = wrapped.core
    assert core.model is model.model and wrapped.readout is model.lm_head
    ours = {p.data_ptr() for p in wrapped.parameters()}
    assert all(p.data_ptr() in ours for p in model.parameters())  # the same tensors, no copies
    assert list(core.state_layout()) == ["l0/conv", "l0/ssm", "l1/keys", "l1/values", "l2/conv", "l2/ssm",
                                         "l3/conv", "l3/ssm"]
    assert core.state_dim == MAMBA * INNER * (KERNEL - 1 + STATE) + 2 * POSITIONS * KV_HEADS * HEAD_DIM
    assert [b.name for b in core.jacobian_structure().blocks if b.held] == ["l1/keys", "l1/values"]
    check_hybrid(family(model), wrapped, tokens, RTOL)


def test_the_bare_model_and_dense_mlps_only() -> None:
    bare = tiny(bare=True, num_experts=1)
    wrapped = gradscope.wrap(bare, positions=POSITIONS)
    assert wrapped.readout is None
    assert not any(hasattr(layer.feed_forward, "experts") for layer in bare.layers)
    check_state_jacobian(family(bare), wrapped, tokens(4), 2, "vjp", RTOL)


def test_the_moe_is_the_librarys_softmax_top_k_without_renormalisation() -> None:
    """The functional MoE equals the library's ``JambaSparseMoeBlock`` token by token, and the routing matters on
    these weights: different tokens pick different expert pairs, and the chosen probabilities do not sum to 1 (a
    renormalised MoE would differ)."""
    model = tiny()
    moe = model.model.layers[1].feed_forward
    x = torch.randn(64, HIDDEN, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with torch.no_grad():
        ours, theirs = jamba_moe(moe, x), moe(x[:, None])[:, 0]
        probs = torch.softmax(x @ moe.router.weight.t(), dim=-1)
        top, index = torch.topk(probs, TOP_K, dim=-1)
    assert float((ours - theirs).abs().max()) <= RTOL * float(theirs.abs().max())  # its softmax runs in float32
    assert len({tuple(sorted(r)) for r in index.tolist()}) >= 4
    assert float(top.sum(-1).max()) < 0.99
    assert float((ours / top.sum(-1, keepdim=True) - theirs).abs().max()) > 1e-2  # what renormalising would give


def test_declared_blocks_and_the_mamba_exponents_with_the_cache_held() -> None:
    """Every declared block equals J_t's own (torch.func) and J_t is lower-triangular over them; the spectrum,
    the cache held, has the Mamba layers' entries only: I·N finite exponents a layer (the diagonal exp(ΔA)) and
    the conv windows' −∞."""
    wrapped = gradscope.wrap(tiny(), positions=POSITIONS)
    check_held_spectrum(wrapped.core, wrapped.core_inputs(tokens(12, length=POSITIONS)),
                        finite=MAMBA * INNER * STATE, minus_inf=MAMBA * INNER * (KERNEL - 1))


def test_what_is_not_built_is_refused_in_one_line() -> None:
    """A sequence beyond the cache's slots, float64 experts under grouped_mm (the library's own forward cannot run
    them), and a Jamba without Mamba layers (no recurrent state)."""
    wrapped = gradscope.wrap(tiny(), positions=4)
    with pytest.raises(GradscopeError, match="holds 4 positions") as err:
        gradscope.state_jacobian(wrapped, tokens(2, length=5), position=2)
    assert "\n" not in str(err.value)
    grouped = tiny()
    grouped.set_experts_implementation("grouped_mm")  # torch's grouped_mm takes no float64: the library could not run
    with pytest.raises(GradscopeError, match="set_experts_implementation") as err:
        gradscope.wrap(grouped, positions=4)
    assert "\n" not in str(err.value)
    with pytest.raises(GradscopeError, match="without Mamba layers") as err:
        gradscope.wrap(tiny(num_hidden_layers=2, attn_layer_period=1, attn_layer_offset=0), positions=4)
    assert "\n" not in str(err.value)
